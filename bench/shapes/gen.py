"""Writes one single-process training program from a combination of dimensions (grammar.py).

`generate(dims, name_seed)` returns a Program: its files, the command line that runs it, and what
a correct conversion must do with its optimizer steps. Names, file names, comments, quotes and
optional spellings come from `name_seed` alone, so the shrinker can change one dimension and keep
everything else as it was."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from grammar import expected_steps, loop_kind
from names import Names

FEATURES = 6
HIDDEN = 12


@dataclass
class Program:
    dims: dict[str, str]
    name_seed: str
    files: dict[str, str]  # relative path -> text
    argv: list[str]  # after `python`: ["train.py", ...] or ["-m", "pkg.train", ...]
    entry_file: str  # the file ddpify converts (and verify runs)
    loop: str  # epochs | iterations
    steps: str  # halved | equal | any
    seeded_data: bool  # every process builds the same data

    def write(self, root) -> None:
        from pathlib import Path

        root = Path(root)
        for rel, text in self.files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)


class Block:
    """Lines with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def add(self, *lines: str) -> None:
        for text in lines:
            for ln in text.split("\n"):
                self.lines.append(("    " * self.level + ln) if ln else "")

    def open(self, header: str) -> _Indent:
        self.add(header)
        return _Indent(self)

    def extend(self, other: Block) -> None:
        for ln in other.lines:
            self.lines.append(("    " * self.level + ln) if ln else "")

    def text(self) -> str:
        return "\n".join(self.lines)


class _Indent:
    def __init__(self, b: Block) -> None:
        self.b = b

    def __enter__(self):
        self.b.level += 1

    def __exit__(self, *exc):
        self.b.level -= 1


_COMMENTS = [
    "# set up",
    "# TODO: tune this",
    "# keep it simple",
    "# training",
    "# the data",
    "# NOTE: small on purpose",
    "# build everything",
    "# see the paper",
    "# hack",
    "# done",
    "# bookkeeping",
    "# main loop",
    "# this matters",
    "# quick sanity run",
    "# XXX",
    "# as before",
]

_KEYS = {
    "epochs": ["epochs", "n_epochs", "num_epochs", "max_epochs", "epoch_count"],
    "iters": ["iters", "num_steps", "max_iters", "total_steps", "n_iter"],
    "bs": ["batch_size", "bs", "batch", "mb_size"],
    "lr": ["lr", "learning_rate", "base_lr", "step_size"],
    "seed": ["seed", "rng_seed", "random_seed", "manual_seed"],
    "out": ["out", "out_dir", "save_dir", "output", "log_dir", "ckpt_dir"],
    "k": ["accum", "grad_accum", "accumulate", "accum_steps"],
    "clip": ["clip", "max_norm", "grad_clip", "clip_norm"],
    "patience": ["patience", "wait", "stop_after"],
    "resume": ["resume", "resume_from", "checkpoint", "restore"],
    "device": ["device", "dev", "use_device"],
    "gpu": ["gpu", "gpu_id", "cuda_id"],
    "arch": ["arch", "model_name", "net", "backbone"],
    "opt": ["optim", "optimizer", "opt_name", "solver"],
}


class Gen:
    def __init__(self, dims: dict[str, str], name_seed: str) -> None:
        self.d = dims
        self.rng = random.Random(name_seed)
        self.n = Names(self.rng)
        r = self.rng
        self.qc = r.choice(['"', "'"])
        self.files: dict[str, str] = {}
        self.body_vars: set[str] = set()
        self.cfg_used: dict[str, object] = {}
        # sizes
        self.n_train = r.choice([64, 96])
        self.n_val = 32
        self.bs = r.choice([8, 16])
        self.epochs = r.choice([2, 3])
        self.iters = r.choice([10, 12])
        self.every = r.choice([4, 5])
        self.k = 2
        self.lr = r.choice([0.05, 0.01, 0.02])
        self.seed = r.randrange(100)
        self.opt_kind = r.choice(["SGD", "Adam", "AdamW"])
        self.key = {k: r.choice(v) for k, v in _KEYS.items()}
        self.names()
        if dims["config"] in ("argparse", "dataclass", "json_file"):
            self.body_vars.add(self.N["cfg"])

    # -- small helpers ----------------------------------------------------------------------
    def q(self, s: str) -> str:
        return f"{self.qc}{s}{self.qc}"

    def fq(self, s: str) -> str:
        return f"f{self.qc}{s}{self.qc}"

    def noise(self, b: Block, p: float = 0.12) -> None:
        if self.rng.random() < p:
            b.add(self.rng.choice(_COMMENTS))
        elif self.rng.random() < p / 2:
            b.add("")

    def names(self) -> None:
        n = self.n
        d = self.d
        self.N = {
            k: n.var()
            for k in [
                "model",
                "opt",
                "sched",
                "crit",
                "cfg",
                "loss",
                "x",
                "y",
                "out",
                "ep",
                "it",
                "bi",
                "history",
                "epoch_loss",
                "running",
                "nb",
                "train_loader",
                "val_loader",
                "loaders",
                "train_it",
                "val_it",
                "dev",
                "scaler",
                "use_amp",
                "teacher",
                "ema",
                "enc",
                "head_model",
                "trainer",
                "steps",
                "best_val",
                "best_state",
                "es_best",
                "es_bad",
                "outdir",
                "logger",
                "fh",
                "csv_f",
                "writer",
                "val",
                "built",
                "opt2",
                "box",
                "fwd",
                "X",
                "Y",
                "Xv",
                "Yv",
                "train_ds",
                "val_ds",
                "full",
                "ck",
                "gen",
                "tout",
                "idx",
                "parser",
            ]
        }
        self.N["X"], self.N["Y"] = self.N["X"].upper(), self.N["Y"].upper()
        self.F = {
            k: n.var()
            for k in [
                "main",
                "make_xy",
                "make_loaders",
                "cycle",
                "build",
                "step_fn",
                "evaluate",
                "make_opt",
                "train_epoch",
                "fit",
                "compute_loss",
                "run",
                "writer_fn",
                "plot_fn",
                "cli_cmd",
                "cli_launch",
                "ema_update",
            ]
        }
        self.C = {
            k: n.cls()
            for k in [
                "Net",
                "Net2",
                "Data",
                "Stream",
                "BatchIter",
                "Trainer",
                "Box",
                "Block",
                "Enc",
                "Head",
                "Cfg",
            ]
        }
        self.A = {
            k: n.var(1)
            for k in [
                "body",
                "head",
                "net",
                "opt",
                "sched",
                "buf",
                "steps",
                "best_val",
                "best_state",
                "es_best",
                "es_bad",
                "inner",
            ]
        }
        self.M = {
            k: n.module()
            for k in [
                "entry",
                "helpers",
                "models",
                "pkg",
                "body_mod",
                "settings",
                "nsdir",
                "nsmod",
                "fakelib",
                "fakecore",
                "clilib",
                "thin",
            ]
        }
        self.files_out = {
            k: n.var(1)
            for k in [
                "model",
                "ckpt",
                "best",
                "ema",
                "init",
                "log",
                "hist",
                "metrics",
                "csvlog",
                "curve",
                "dump",
                "cfgjson",
            ]
        }
        self.outdir_name = n.var(1)
        self.table_keys = [n.var(1), n.var(1)]
        self.opt_keys = [n.var(1), n.var(1)]
        self.dict_keys = [n.var(1), n.var(1)]
        self.trained_arch = self.table_keys[self.rng.randrange(2)]
        self.trained_opt = self.opt_keys[self.rng.randrange(2)]
        self.res_in_body = self.rng.random() < 0.5
        self.use_tensordataset = self.rng.random() < 0.3
        self.log_basic = self.rng.random() < 0.5
        self.argv_flags = self.rng.random() < 0.5
        self.to_device_dev = d["device"]

    # -- configuration ----------------------------------------------------------------------
    def cfgv(self, key: str, default) -> str:
        """The expression that reads one setting, in the body's scope."""
        self.cfg_used[key] = default
        name = self.key[key]
        c = self.d["config"]
        if c == "argparse":
            return f"{self.N['cfg']}.{name}"
        if c == "constants":
            return name.upper()
        if c == "dataclass":
            return f"{self.N['cfg']}.{name}"
        if c == "json_file":
            return f"{self.N['cfg']}[{self.q(name)}]"
        return f"{self.M['settings']}.{name.upper()}"

    def lit(self, v) -> str:
        return self.q(v) if isinstance(v, str) else repr(v)

    def config_module_level(self) -> list[str]:
        c = self.d["config"]
        if c == "constants":
            return [
                f"{self.key[k].upper()} = {self.lit(v)}"
                for k, v in self.cfg_used.items()
            ]
        if c == "dataclass":
            lines = ["@dataclass", f"class {self.C['Cfg']}:"]
            for k, v in self.cfg_used.items():
                t = type(v).__name__
                lines.append(f"    {self.key[k]}: {t} = {self.lit(v)}")
            if not self.cfg_used:
                lines.append("    pass")
            return lines
        return []

    def config_body(self) -> list[str]:
        c = self.d["config"]
        cfg = self.N["cfg"]
        if c == "argparse":
            p = self.N["parser"]
            lines = [f"{p} = argparse.ArgumentParser()"]
            for k, v in self.cfg_used.items():
                t = type(v).__name__
                lines.append(
                    f"{p}.add_argument({self.q('--' + self.key[k].replace('_', '-'))}, type={t}, default={self.lit(v)})"
                )
            lines.append(f"{cfg} = {p}.parse_args()")
            self.body_vars.add(cfg)
            return lines
        if c == "dataclass":
            self.body_vars.add(cfg)
            return [f"{cfg} = {self.C['Cfg']}()"]
        if c == "json_file":
            self.body_vars.add(cfg)
            fh = self.N["fh"]
            return [
                f"with open({self.q(self.files_out['cfgjson'] + '.json')}) as {fh}:",
                f"    {cfg} = json.load({fh})",
            ]
        return []

    def argv_extra(self) -> list[str]:
        if self.d["config"] != "argparse" or not self.argv_flags:
            return []
        out = []
        for k in ("epochs", "iters", "bs"):
            if k in self.cfg_used:
                out += ["--" + self.key[k].replace("_", "-"), str(self.cfg_used[k])]
        return out

    # -- the model ---------------------------------------------------------------------------
    def out_dim(self) -> int:
        return 3 if self.d["loss"] == "cross_entropy" else 1

    def loss_fn_expr(self, o: str, t: str) -> str:
        lo = self.d["loss"]
        return {
            "mse": f"F.mse_loss({o}, {t})",
            "cross_entropy": f"F.cross_entropy({o}, {t})",
            "bce_logits": f"F.binary_cross_entropy_with_logits({o}, {t})",
            "bce_prob": f"F.binary_cross_entropy(torch.sigmoid({o}), {t})",
            "smooth_l1": f"F.smooth_l1_loss({o}, {t})",
        }[lo]

    def crit_def(self) -> str:
        lo = self.d["loss"]
        return {
            "mse": "nn.MSELoss()",
            "cross_entropy": "nn.CrossEntropyLoss()",
            "bce_logits": "nn.BCEWithLogitsLoss()",
            "bce_prob": None,
            "smooth_l1": "nn.SmoothL1Loss()",
        }[lo]

    def body_seq(self) -> list[str]:
        a = self.d["arch"]
        H = HIDDEN
        if a == "mlp":
            return [
                f"nn.Linear({FEATURES}, {H})",
                "nn.ReLU()",
                f"nn.Linear({H}, {H})",
                "nn.Tanh()",
            ]
        if a == "batchnorm":
            return [f"nn.Linear({FEATURES}, {H})", f"nn.BatchNorm1d({H})", "nn.ReLU()"]
        if a == "dropout":
            return [f"nn.Linear({FEATURES}, {H})", "nn.ReLU()", "nn.Dropout(0.1)"]
        if a == "residual":
            return [
                f"nn.Linear({FEATURES}, {H})",
                "nn.ReLU()",
                f"{self.C['Block']}({H})",
            ]
        return [f"nn.Linear({FEATURES}, {H})", "nn.ReLU()"]

    def model_classes(self) -> list[str]:
        A, C = self.A, self.C
        x, y = "inp", "target"
        L: list[str] = []
        if self.d["arch"] == "residual":
            L += [
                f"class {C['Block']}(nn.Module):",
                "    def __init__(self, width):",
                "        super().__init__()",
                "        self.lin = nn.Linear(width, width)",
                "",
                "    def forward(self, h):",
                "        return h + torch.relu(self.lin(h))",
                "",
                "",
            ]
        buf = self.d["arch"] == "buffer"
        seq = ", ".join(self.body_seq())
        out = self.out_dim()

        def forward_tail(head_expr: str) -> list[str]:
            lines = [f"        out = {head_expr}"]
            if self.d["forward"] == "loss_in_forward":
                lines += [
                    f"        if {y} is None:",
                    "            return out",
                    f"        return {self.loss_fn_expr('out', y)}",
                ]
            else:
                lines += ["        return out"]
            return lines

        sig = (
            f"self, {x}, {y}=None"
            if self.d["forward"] == "loss_in_forward"
            else f"self, {x}"
        )
        method = (
            []
            if self.d["forward"] != "method"
            else [
                "",
                f"    def {self.F['compute_loss']}(self, {x}, {y}):",
                f"        return {self.loss_fn_expr(f'self({x})', y)}",
            ]
        )

        if self.d["model_site"] == "two_models":
            L += [
                f"class {C['Enc']}(nn.Module):",
                "    def __init__(self):",
                "        super().__init__()",
                f"        self.{A['body']} = nn.Sequential({seq})",
            ]
            if buf:
                L += [
                    f"        self.register_buffer({self.q(A['buf'])}, torch.zeros({HIDDEN}))"
                ]
            L += [
                "",
                f"    def forward(self, {x}):",
                f"        h = self.{A['body']}({x})",
            ]
            if buf:
                L += [
                    "        if self.training:",
                    f"            self.{A['buf']}.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)",
                ]
            L += ["        return h", "", ""]
            L += [
                f"class {C['Head']}(nn.Module):",
                "    def __init__(self):",
                "        super().__init__()",
                f"        self.{A['head']} = nn.Linear({HIDDEN}, {out})",
                "",
                f"    def forward({sig}):",
            ]
            L += forward_tail(f"self.{A['head']}({x})") + method
            return L
        names = [C["Net"]] + ([C["Net2"]] if self.d["model_site"] == "table" else [])
        for i, cname in enumerate(names):
            hid = HIDDEN if i == 0 else HIDDEN + 4
            s = seq.replace(str(HIDDEN), str(hid))
            L += [
                f"class {cname}(nn.Module):",
                "    def __init__(self):",
                "        super().__init__()",
                f"        self.{A['body']} = nn.Sequential({s})",
                f"        self.{A['head']} = nn.Linear({hid}, {out})",
            ]
            if buf:
                L += [
                    f"        self.register_buffer({self.q(A['buf'])}, torch.zeros({hid}))"
                ]
            L += ["", f"    def forward({sig}):", f"        h = self.{A['body']}({x})"]
            if buf:
                L += [
                    "        if self.training:",
                    f"            self.{A['buf']}.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)",
                ]
            L += forward_tail(f"self.{A['head']}(h)") + method + ["", ""]
        return L[:-2]

    # -- device ----------------------------------------------------------------------------
    def needs_dev(self) -> bool:
        return self.d["device"] in ("to_device", "dataparallel", "set_device")

    def place(self, var: str, dev: str) -> list[str]:
        dv = self.d["device"]
        if dv == "cpu_only":
            return []
        if dv == "cuda_guarded":
            return (
                ["if torch.cuda.is_available():", f"    {var} = {var}.cuda()"]
                if "." not in var
                else ["if torch.cuda.is_available():", f"    {var}.cuda()"]
            )
        return [f"{var} = {var}.to({dev})"] if "." not in var else [f"{var}.to({dev})"]

    def move(self, x: str, y: str, dev: str) -> list[str]:
        dv = self.d["device"]
        if dv == "cpu_only":
            return []
        if dv == "cuda_guarded":
            return [
                "if torch.cuda.is_available():",
                f"    {x}, {y} = {x}.cuda(), {y}.cuda()",
            ]
        return [f"{x}, {y} = {x}.to({dev}), {y}.to({dev})"]

    def dev_def(self, at_module: bool) -> list[str]:
        dv, dev = self.d["device"], self.N["dev"]
        if dv == "to_device":
            if at_module:
                return [
                    f"{dev} = torch.device({self.q('cuda')} if torch.cuda.is_available() else {self.q('cpu')})"
                ]
            return [
                f"{dev} = torch.device({self.cfgv('device', 'cuda')} if torch.cuda.is_available() else {self.q('cpu')})"
            ]
        if dv == "dataparallel":
            return [
                f"{dev} = torch.device({self.q('cuda')} if torch.cuda.is_available() else {self.q('cpu')})"
            ]
        if dv == "set_device":
            gpu = "0" if at_module else self.cfgv("gpu", 0)
            return [
                "if torch.cuda.is_available():",
                f"    torch.cuda.set_device({gpu})",
                f"{dev} = torch.device({self.q('cuda')}, {gpu}) if torch.cuda.is_available() else torch.device({self.q('cpu')})",
            ]
        return []

    # -- optimizer ---------------------------------------------------------------------------
    def opt_expr(
        self, m: str, lr: str, m2: str | None = None, kind: str | None = None
    ) -> str:
        o, A = self.d["optimizer"], self.A
        cls = f"torch.optim.{self.opt_kind}"
        extra = (
            ", momentum=0.9"
            if self.opt_kind == "SGD" and self.rng.random() < 0.5
            else ""
        )
        if o == "groups":
            return (
                f"{cls}([{{{self.q('params')}: {m}.{A['body']}.parameters(), {self.q('lr')}: {lr} * 0.5}}, "
                f"{{{self.q('params')}: {m}.{A['head']}.parameters()}}], lr={lr}{extra})"
            )
        if o == "frozen_filter":
            return f"{cls}(filter(lambda p: p.requires_grad, {m}.parameters()), lr={lr}{extra})"
        if o == "chained":
            return f"{cls}(itertools.chain({m}.parameters(), {m2}.parameters()), lr={lr}{extra})"
        if o == "helper":
            return f"{self.F['make_opt']}({m}, {lr}, {self.q(self.opt_kind.lower())})"
        if o == "table":
            return f"{self.N['opt'].upper()}S[{kind or self.cfgv('opt', self.trained_opt)}]({m}.parameters(), lr={lr})"
        if o == "holder_class":
            return f"{self.C['Box']}({m}.parameters(), {lr})"
        return f"{cls}({m}.parameters(), lr={lr}{extra})"

    def freeze_lines(self, m: str) -> list[str]:
        if self.d["optimizer"] != "frozen_filter":
            return []
        return [
            f"for p in {m}.{self.A['body']}[0].parameters():",
            "    p.requires_grad = False",
        ]

    def opt_lib_defs(self) -> list[str]:
        o = self.d["optimizer"]
        if o == "helper":
            return [
                f"def {self.F['make_opt']}(net, lr, kind):",
                f"    if kind == {self.q('sgd')}:",
                "        return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)",
                f"    if kind == {self.q('adamw')}:",
                "        return torch.optim.AdamW(net.parameters(), lr=lr)",
                "    return torch.optim.Adam(net.parameters(), lr=lr)",
            ]
        if o == "holder_class":
            inner = self.A["inner"]
            return [
                f"class {self.C['Box']}:",
                "    def __init__(self, params, lr):",
                f"        self.{inner} = torch.optim.{self.opt_kind}(params, lr=lr)",
                "",
                "    def step(self):",
                f"        self.{inner}.step()",
                f"        self.{inner}.zero_grad()",
            ]
        return []

    def opt_table_def(self) -> list[str]:
        if self.d["optimizer"] != "table":
            return []
        a, b = self.opt_keys
        return [
            f"{self.N['opt'].upper()}S = {{{self.q(a)}: torch.optim.SGD, {self.q(b)}: torch.optim.Adam}}"
        ]

    # -- data ------------------------------------------------------------------------------
    def data_lib_defs(self) -> list[str]:
        d, C, F_ = self.d, self.C, self.F
        L = [f"def {F_['make_xy']}(n, g=None):"]
        if d["randomness"] == "all_libs":
            L += [
                f"    x = torch.from_numpy(np.random.randn(n, {FEATURES}).astype({self.q('float32')}))"
            ]
        else:
            L += [f"    x = torch.randn(n, {FEATURES}, generator=g)"]
        lo = d["loss"]
        if lo in ("mse", "smooth_l1"):
            L += [
                f"    y = (x * torch.linspace(-1, 1, {FEATURES})).sum(1, keepdim=True)"
            ]
        elif lo == "cross_entropy":
            L += ["    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()"]
        else:
            L += ["    y = (x.sum(1, keepdim=True) > 0).float()"]
        L += ["    return x, y", "", ""]
        data = d["data"]
        if (
            data
            in (
                "loader",
                "helper_tuple",
                "helper_dict",
                "cycle_shared",
                "iter_count",
                "random_split",
                "subset",
                "iterable",
                "own_sampler",
                "batch_sampler",
                "sampler_none",
            )
            and not self.use_tensordataset
        ):
            L += [
                f"class {C['Data']}(Dataset):",
                "    def __init__(self, n, g=None):",
                f"        self.x, self.y = {F_['make_xy']}(n, g)",
                "",
                "    def __len__(self):",
                "        return len(self.x)",
                "",
                "    def __getitem__(self, i):",
                "        return self.x[i], self.y[i]",
                "",
                "",
            ]
        if data == "iterable":
            L += [
                f"class {C['Stream']}(IterableDataset):",
                "    def __init__(self, n, g=None):",
                f"        self.x, self.y = {F_['make_xy']}(n, g)",
                "",
                "    def __iter__(self):",
                "        for i in range(len(self.x)):",
                "            yield self.x[i], self.y[i]",
                "",
                "",
            ]
        if data == "own_iter":
            L += [
                f"class {C['BatchIter']}:",
                "    def __init__(self, x, y, size, shuffle):",
                "        self.x, self.y, self.size, self.shuffle = x, y, size, shuffle",
                "",
                "    def __len__(self):",
                "        return (len(self.x) + self.size - 1) // self.size",
                "",
                "    def __iter__(self):",
                "        order = torch.randperm(len(self.x)) if self.shuffle else torch.arange(len(self.x))",
                "        for i in range(0, len(order), self.size):",
                "            j = order[i:i + self.size]",
                "            yield self.x[j], self.y[j]",
                "",
                "",
            ]
        if data == "own_sampler":  # the class names of data variants it never meets
            L += [
                f"class {C['BatchIter']}(Sampler):",
                "    def __init__(self, n):",
                "        self.n = n",
                "",
                "    def __iter__(self):",
                "        return iter(torch.randperm(self.n).tolist())",
                "",
                "    def __len__(self):",
                "        return self.n",
                "",
                "",
            ]
        if data == "batch_sampler":
            L += [
                f"class {C['Stream']}(Sampler):",
                "    def __init__(self, n, size):",
                "        self.n, self.size = n, size",
                "",
                "    def __iter__(self):",
                "        order = torch.randperm(self.n).tolist()",
                "        for i in range(0, self.n, self.size):",
                "            yield order[i:i + self.size]",
                "",
                "    def __len__(self):",
                "        return (self.n + self.size - 1) // self.size",
                "",
                "",
            ]
        if data in ("helper_tuple", "helper_dict"):
            L += [
                f"def {F_['make_loaders']}(size, g=None):",
                f"    tr = DataLoader({self.ds_expr(self.n_train, 'g')}, batch_size=size, shuffle=True)",
                f"    va = DataLoader({self.ds_expr(self.n_val, 'g')}, batch_size=size)",
            ]
            if data == "helper_tuple":
                L += ["    return tr, va", "", ""]
            else:
                L += [
                    f"    return {{{self.q(self.dict_keys[0])}: tr, {self.q(self.dict_keys[1])}: va}}",
                    "",
                    "",
                ]
        if data == "cycle_shared":
            L += [
                f"def {F_['cycle']}(loader):",
                "    while True:",
                "        for batch in loader:",
                "            yield batch",
                "",
                "",
            ]
        return L

    def ds_expr(self, n, g: str) -> str:
        if self.use_tensordataset:
            return f"TensorDataset(*{self.F['make_xy']}({n}, {g}))"
        return f"{self.C['Data']}({n}, {g})"

    def gen_arg(self) -> str:
        return self.N["gen"] if self.d["randomness"] == "data_generator" else "None"

    def data_body(self, b: Block) -> tuple[str, str]:
        """Builds the data in the body; returns (train source, val source) expressions."""
        d, N = self.d["data"], self.N
        bs = self.cfgv("bs", self.bs)
        g = self.gen_arg()
        if self.d["randomness"] == "data_generator":
            b.add(
                f"{N['gen']} = torch.Generator().manual_seed({self.cfgv('seed', self.seed)})"
            )
            self.body_vars.add(N["gen"])
        tl, vl = N["train_loader"], N["val_loader"]
        own = ("own_sampler", "batch_sampler", "sampler_none")
        if d in ("loader", "cycle_shared", "iter_count") + own:
            b.add(
                f"{N['train_ds']} = {self.ds_expr(self.n_train, g)}",
                f"{N['val_ds']} = {self.ds_expr(self.n_val, g)}",
            )
            td, idx = N["train_ds"], N["idx"]  # idx: the subset's name, free here
            if d == "own_sampler":
                b.add(
                    f"{tl} = DataLoader({td}, batch_size={bs}, sampler={self.C['BatchIter']}(len({td})))"
                )
            elif d == "batch_sampler":
                b.add(
                    f"{tl} = DataLoader({td}, batch_sampler={self.C['Stream']}(len({td}), {bs}))"
                )
            elif d == "sampler_none":
                b.add(
                    f"{idx} = None",
                    f"{tl} = DataLoader({td}, batch_size={bs}, shuffle={idx} is None, sampler={idx})",
                )
                self.body_vars.add(idx)
            else:
                b.add(f"{tl} = DataLoader({td}, batch_size={bs}, shuffle=True)")
            b.add(f"{vl} = DataLoader({N['val_ds']}, batch_size={bs}, shuffle=False)")
            self.body_vars |= {N["train_ds"], N["val_ds"], tl, vl}
            if d == "iter_count":
                b.add(f"{N['train_it']} = iter({tl})")
                self.body_vars.add(N["train_it"])
            if d == "cycle_shared":
                b.add(
                    f"{N['train_it']} = {self.F['cycle']}({tl})",
                    f"{N['val_it']} = {self.F['cycle']}({vl})",
                )
                self.body_vars |= {N["train_it"], N["val_it"]}
                return N["train_it"], f"itertools.islice({N['val_it']}, 2)"
            return tl, vl
        if d == "helper_tuple":
            b.add(f"{tl}, {vl} = {self.F['make_loaders']}({bs}, {g})")
            self.body_vars |= {tl, vl}
            return tl, vl
        if d == "helper_dict":
            b.add(f"{N['loaders']} = {self.F['make_loaders']}({bs}, {g})")
            self.body_vars.add(N["loaders"])
            return (
                f"{N['loaders']}[{self.q(self.dict_keys[0])}]",
                f"{N['loaders']}[{self.q(self.dict_keys[1])}]",
            )
        if d in ("random_split", "subset"):
            total = self.n_train + self.n_val
            b.add(f"{N['full']} = {self.ds_expr(total, g)}")
            if d == "random_split":
                split_g = (
                    f", generator={g}" if g != "None" else ""
                )  # the split is the data's, seeded alike
                b.add(
                    f"{N['train_ds']}, {N['val_ds']} = random_split({N['full']}, [{self.n_train}, {self.n_val}]{split_g})"
                )
            else:
                b.add(
                    f"{N['idx']} = list(range({total}))",
                    f"{N['train_ds']} = Subset({N['full']}, {N['idx']}[:{self.n_train}])",
                    f"{N['val_ds']} = Subset({N['full']}, {N['idx']}[{self.n_train}:])",
                )
            b.add(
                f"{tl} = DataLoader({N['train_ds']}, batch_size={bs}, shuffle=True)",
                f"{vl} = DataLoader({N['val_ds']}, batch_size={bs})",
            )
            self.body_vars |= {N["full"], N["train_ds"], N["val_ds"], tl, vl, N["idx"]}
            return tl, vl
        if d == "iterable":
            b.add(
                f"{tl} = DataLoader({self.C['Stream']}({self.n_train}, {g}), batch_size={bs})",
                f"{vl} = DataLoader({self.ds_expr(self.n_val, g)}, batch_size={bs})",
            )
            self.body_vars |= {tl, vl}
            return tl, vl
        # tensors in memory
        X, Y, Xv, Yv = N["X"], N["Y"], N["Xv"], N["Yv"]
        b.add(
            f"{X}, {Y} = {self.F['make_xy']}({self.n_train}, {g})",
            f"{Xv}, {Yv} = {self.F['make_xy']}({self.n_val}, {g})",
        )
        self.body_vars |= {X, Y, Xv, Yv}
        if d == "own_iter":
            b.add(
                f"{tl} = {self.C['BatchIter']}({X}, {Y}, {bs}, True)",
                f"{vl} = {self.C['BatchIter']}({Xv}, {Yv}, {bs}, False)",
            )
            self.body_vars |= {tl, vl}
            return tl, vl
        return "FULL", f"[({Xv}, {Yv})]"

    # -- the step --------------------------------------------------------------------------
    def forward_lines(
        self, env: dict[str, str], x: str, y: str, loss: str
    ) -> list[str]:
        f, site = self.d["forward"], self.d["model_site"]
        if site == "two_models":
            A_, B_ = env["enc"], env["head_model"]
            call = lambda a: f"{B_}({A_}({a}))"  # noqa: E731
            mods = [A_, B_]
        else:
            call = lambda a: f"{env['model']}({a})"  # noqa: E731
            mods = [env["model"]]
        teach = site == "teacher"
        if f == "call":
            lines = [
                f"{self.N['out']} = {call(x)}",
                f"{loss} = {env['crit']}({self.N['out']}, {y})",
            ]
            if teach:
                lines = (
                    [
                        "with torch.no_grad():",
                        f"    {self.N['tout']} = {env['teacher']}({x})",
                    ]
                    + lines
                    + [
                        f"{loss} = {loss} + 0.5 * F.mse_loss({self.N['out']}, {self.N['tout']})"
                    ]
                )
            return lines
        if f == "loss_in_forward":
            inner = f"{A_}({x})" if site == "two_models" else x
            m = B_ if site == "two_models" else env["model"]
            return [f"{loss} = {m}({inner}, {y})"]
        if f == "method":
            inner = f"{A_}({x})" if site == "two_models" else x
            m = B_ if site == "two_models" else env["model"]
            return [f"{loss} = {m}.{self.F['compute_loss']}({inner}, {y})"]
        if f == "step_helper":
            args = mods + ([env["teacher"]] if teach else []) + [env["crit"], x, y]
            return [f"{loss} = {self.F['step_fn']}({', '.join(args)})"]
        return [f"{loss} = {env['fwd']}({x}, {y})"]

    def step_helper_def(self) -> list[str]:
        f, site = self.d["forward"], self.d["model_site"]
        if f not in ("step_helper", "partial"):
            return []
        mods = ["enc", "head"] if site == "two_models" else ["net"]
        args = mods + (["teacher"] if site == "teacher" else []) + ["crit", "a", "b"]
        call = "head(enc(a))" if site == "two_models" else "net(a)"
        L = [
            f"def {self.F['step_fn']}({', '.join(args)}):",
            f"    out = {call}",
            "    loss = crit(out, b)",
        ]
        if site == "teacher":
            L += [
                "    with torch.no_grad():",
                "        t = teacher(a)",
                "    loss = loss + 0.5 * F.mse_loss(out, t)",
            ]
        return L + ["    return loss"]

    def crit_lib_def(self) -> list[str]:
        if self.d["loss"] != "bce_prob" or not self.uses_crit():
            return []
        return [
            f"def {self.N['crit']}(o, t):",
            "    return F.binary_cross_entropy(torch.sigmoid(o), t)",
        ]

    def uses_crit(self) -> bool:
        return self.d["forward"] in ("call", "step_helper", "partial")

    def step_lines(self, env: dict[str, str], bi: str) -> list[str]:
        d, N = self.d, self.N
        loss = N["loss"]
        prec = d["precision"]
        L: list[str] = []
        fw = self.forward_lines(env, N["x"], N["y"], loss)
        if prec == "none":
            L += fw
        else:
            if prec == "amp_scaler":
                head = (
                    f"with torch.autocast({self.q('cuda')}, enabled={env['use_amp']}):"
                )
            elif prec == "bf16_autocast":
                head = (
                    f"with torch.autocast({self.q('cuda')} if torch.cuda.is_available() else {self.q('cpu')}, "
                    f"dtype=torch.bfloat16, enabled={env['use_amp']}):"
                )
            else:
                head = f"with torch.cuda.amp.autocast(enabled={env['use_amp']}):"
            L += [head] + ["    " + ln for ln in fw]
        accum = d["step"] == "accum"
        scaled = prec in ("amp_scaler", "legacy_cuda_amp")
        back_loss = f"{loss} / {env['k']}" if accum else loss
        L += [
            f"{env['scaler']}.scale({back_loss}).backward()"
            if scaled
            else f"({back_loss}).backward()"
            if accum
            else f"{loss}.backward()"
        ]
        S: list[str] = []
        opts = [env["opt"]] + ([env["opt2"]] if d["step"] == "two_opts" else [])
        inner_opt = (
            f"{env['opt']}.{self.A['inner']}"
            if d["optimizer"] == "holder_class"
            else env["opt"]
        )
        if d["step"] == "clip":
            if scaled:
                S += [f"{env['scaler']}.unscale_({inner_opt})"]
            S += [
                f"torch.nn.utils.clip_grad_norm_({self.params_expr(env)}, {env['clip']})"
            ]
        if d["optimizer"] == "holder_class":
            S += [f"{env['opt']}.step()"]
        else:
            for o in opts:
                S += [f"{env['scaler']}.step({o})" if scaled else f"{o}.step()"]
            if scaled:
                S += [f"{env['scaler']}.update()"]
            for o in opts:
                S += [f"{o}.zero_grad()"]
        if d["step"] == "sched_iter":
            S += [f"{env['sched']}.step()"]
        if d["model_site"] == "ema":
            S += [f"{self.F['ema_update']}({env['ema']}, {env['model']})"]
        S += [f"{env['steps']} += 1"]
        if accum:
            L += [f"if ({bi} + 1) % {env['k']} == 0:"] + ["    " + s for s in S]
        else:
            L += S
        return L

    def params_expr(self, env) -> str:
        if self.d["model_site"] == "two_models":
            return f"list({env['enc']}.parameters()) + list({env['head_model']}.parameters())"
        return f"{env['model']}.parameters()"

    def ema_def(self) -> list[str]:
        if self.d["model_site"] != "ema":
            return []
        return [
            f"def {self.F['ema_update']}(avg, cur, decay=0.9):",
            "    with torch.no_grad():",
            "        for pa, pc in zip(avg.parameters(), cur.parameters()):",
            "            pa.mul_(decay).add_(pc.detach(), alpha=1 - decay)",
        ]

    def eval_def(self) -> list[str]:
        if self.d["evaluation"] == "none" and self.d["step"] != "early_stop":
            return []
        site, f = self.d["model_site"], self.d["forward"]
        nets = ["enc", "head"] if site == "two_models" else ["net"]
        args = (
            nets
            + ["batches"]
            + (["crit"] if self.uses_crit() else [])
            + (["dev"] if self.needs_dev() else [])
        )
        call = "head(enc(a))" if site == "two_models" else "net(a)"
        m, inner = ("head", "enc(a)") if site == "two_models" else ("net", "a")
        if f == "loss_in_forward":
            lossx = f"{m}({inner}, b)"
        elif f == "method":
            lossx = f"{m}.{self.F['compute_loss']}({inner}, b)"
        else:
            lossx = f"crit({call}, b)"
        L = [f"def {self.F['evaluate']}({', '.join(args)}):"]
        L += [f"    {n}.eval()" for n in nets]
        L += [
            "    total, count = 0.0, 0",
            "    with torch.no_grad():",
            "        for a, b in batches:",
        ]
        L += ["            " + ln for ln in self.move("a", "b", "dev")]
        L += [
            f"            total += float({lossx}) * len(a)",
            "            count += len(a)",
        ]
        L += [f"    {n}.train()" for n in nets]
        return L + ["    return total / max(count, 1)"]

    def eval_call(self, env, val_src: str) -> str:
        site = self.d["model_site"]
        nets = (
            [env["enc"], env["head_model"]] if site == "two_models" else [env["model"]]
        )
        args = (
            nets
            + [val_src]
            + ([env["crit"]] if self.uses_crit() else [])
            + ([env["dev"]] if self.needs_dev() else [])
        )
        return f"{self.F['evaluate']}({', '.join(args)})"

    # -- paths -------------------------------------------------------------------------------
    def path(self, stem: str, ext: str, fmt: str | None = None) -> str:
        """A path expression for an output file; fmt: an f-string part (`_{ep}`)."""
        name = f"{stem}{fmt or ''}.{ext}"
        lit = self.fq(name) if fmt else self.q(name)
        od = self.d["out_dir"]
        if od == "cwd":
            return lit
        if od == "pathlib":
            return f"{self.N['outdir']} / {lit}"
        return f"os.path.join({self.N['outdir']}, {lit})"

    def outdir_lines(self) -> list[str]:
        od, o = self.d["out_dir"], self.N["outdir"]
        if od == "cwd":
            return []
        self.body_vars.add(o)
        base = self.cfgv("out", self.outdir_name)
        if od == "makedirs":
            return [f"{o} = {base}", f"os.makedirs({o}, exist_ok=True)"]
        if od == "time_dir":
            return [
                f"{o} = os.path.join({base}, time.strftime({self.q('%Y%m%d-%H%M%S')}))",
                f"os.makedirs({o}, exist_ok=True)",
            ]
        return [f"{o} = Path({base})", f"{o}.mkdir(parents=True, exist_ok=True)"]

    def primary(self, env) -> str:
        if self.d["device"] == "dataparallel":
            return f"({env['model']}.module if hasattr({env['model']}, {self.q('module')}) else {env['model']})"
        return env["model"]

    def trained(self, env) -> list[str]:
        if self.d["model_site"] == "two_models":
            return [env["enc"], env["head_model"]]
        return [self.primary(env)]

    def state_of(self, env) -> str:
        if self.d["model_site"] == "two_models":
            return f"{{{self.q('enc')}: {env['enc']}.state_dict(), {self.q('head')}: {env['head_model']}.state_dict()}}"
        return f"{self.primary(env)}.state_dict()"

    def inner_opt(self, env) -> str:
        return (
            f"{env['opt']}.{self.A['inner']}"
            if self.d["optimizer"] == "holder_class"
            else env["opt"]
        )

    # -- the loops ---------------------------------------------------------------------------
    def epoch_end(self, env, b: Block, tag: str, loss_expr: str, val_src: str) -> None:
        """Per-epoch (or every few iterations) work: logs, scheduler, evaluation, stopping, saves."""
        d, N = self.d, self.N
        b.add(f"{env['history']}.append({loss_expr})")
        b.add(f"print({self.fq(f'{{{tag}}}: loss {{{loss_expr}:.4f}}')})")
        if d["artifacts"] == "logging_file":
            b.add(
                f"{'logging' if self.log_basic else env['logger']}.info({self.q('%d %.4f')}, {tag}, {loss_expr})"
            )
        if d["artifacts"] == "csv":
            b.add(f"{env['writer']}.writerow([{tag}, {loss_expr}])")
        if d["step"] == "sched_epoch":
            b.add(f"{env['sched']}.step()")
        ev = d["evaluation"]
        val = N["val"]
        has_val = ev in ("no_grad", "best_copy", "periodic")
        if ev == "periodic":
            with b.open(f"if {tag} % 2 == 0:"):
                b.add(
                    f"{val} = {self.eval_call(env, val_src)}",
                    f"print({self.fq('val {' + val + ':.4f}')})",
                )
            b.add("else:", f"    {val} = {loss_expr}")
        elif ev in ("no_grad", "best_copy"):
            b.add(
                f"{val} = {self.eval_call(env, val_src)}",
                f"print({self.fq('val {' + val + ':.4f}')})",
            )
        if ev == "best_copy":
            with b.open(f"if {val} < {env['best_val']}:"):
                b.add(
                    f"{env['best_val']} = {val}",
                    f"{env['best_state']} = copy.deepcopy({self.state_of(env)})",
                )
        if d["checkpoint"] == "per_epoch":
            b.add(
                f"torch.save({{{self.q('epoch')}: {tag}, {self.q('model')}: {self.state_of(env)}, "
                f"{self.q('optimizer')}: {self.inner_opt(env)}.state_dict()}}, {self.path(self.files_out['ckpt'], 'pt', '_{' + tag + '}')})"
            )
        if d["step"] == "early_stop":
            metric = val if has_val else loss_expr
            with b.open(f"if {metric} < {env['es_best']} - 1e-3:"):
                b.add(f"{env['es_best']} = {metric}", f"{env['es_bad']} = 0")
            with b.open("else:"):
                b.add(f"{env['es_bad']} += 1")
                with b.open(f"if {env['es_bad']} >= {env['patience']}:"):
                    b.add(f"print({self.q('early stop')})", "break")

    def inner_epoch(self, env, train_src: str) -> Block:
        """One epoch over the training data: sets env['epoch_loss']."""
        N = self.N
        b = Block()
        b.add(f"{N['running']}, {N['nb']} = 0.0, 0")
        if train_src == "FULL":
            b.add(f"{N['bi']} = 0", f"{N['x']}, {N['y']} = {env['X']}, {env['Y']}")
            body = Block()
        else:
            header = f"for {N['bi']}, ({N['x']}, {N['y']}) in enumerate({train_src}):"
            body = Block()
        body.add(*self.move(N["x"], N["y"], env["dev"]))
        self.noise(body)
        body.add(*self.step_lines(env, N["bi"]))
        body.add(f"{N['running']} += {N['loss']}.item()", f"{N['nb']} += 1")
        if train_src == "FULL":
            b.extend(body)
        else:
            with b.open(header):
                b.extend(body)
        b.add(f"{N['epoch_loss']} = {N['running']} / max({N['nb']}, 1)")
        return b

    def outer_loop(self, env, train_src: str, val_src: str) -> Block:
        d, N = self.d, self.N
        b = Block()
        lf = d["loop_form"]
        if loop_kind(d) == "iterations":
            it = N["it"]
            n_it = env["iters"]
            if lf == "while_counter":
                b.add(f"{it} = 0")
                hdr = f"while {it} < {n_it}:"
            else:
                hdr = f"for {it} in range({n_it}):"
            with b.open(hdr):
                if d["data"] == "cycle_shared":
                    b.add(f"{N['x']}, {N['y']} = next({env['train_it']})")
                else:
                    with b.open("try:"):
                        b.add(f"{N['x']}, {N['y']} = next({env['train_it']})")
                    with b.open("except StopIteration:"):
                        b.add(
                            f"{env['train_it']} = iter({train_src})",
                            f"{N['x']}, {N['y']} = next({env['train_it']})",
                        )
                b.add(*self.move(N["x"], N["y"], env["dev"]))
                self.noise(b)
                b.add(*self.step_lines(env, it))
                if lf == "while_counter":
                    b.add(f"{it} += 1")
                with b.open(
                    f"if ({it} + 1) % {self.every} == 0:"
                    if lf != "while_counter"
                    else f"if {it} % {self.every} == 0:"
                ):
                    self.epoch_end(env, b, it, f"{N['loss']}.item()", val_src)
            return b
        ep = N["ep"]
        if lf == "while_counter":
            b.add(f"{ep} = 0")
            hdr = f"while {ep} < {env['epochs']}:"
        else:
            hdr = f"for {ep} in range({env['epochs']}):"
        with b.open(hdr):
            if lf == "epoch_fn":
                args = self._epoch_fn_args
                b.add(
                    f"{N['epoch_loss']}, {env['steps']} = {self.F['train_epoch']}({', '.join(args)})"
                )
            else:
                b.extend(self.inner_epoch(env, train_src))
            if lf == "while_counter":
                b.add(f"{ep} += 1")
            self.epoch_end(env, b, ep, N["epoch_loss"], val_src)
        return b

    # -- assembly ----------------------------------------------------------------------------
    def free_vars(self, text: str) -> list[str]:
        seen = []
        for tok in re.findall(r"(?<![.\w])([A-Za-z_]\w*)", text):
            if tok in self.body_vars and tok not in seen:
                seen.append(tok)
        return seen

    def build(self) -> Program:
        d, N, F_, C, A = self.d, self.N, self.F, self.C, self.A
        site = d["model_site"]
        entry = d["entry"]
        trainer = site == "trainer"

        # settings whose reads appear in the body
        env = {k: N[k] for k in N}
        env.update(
            steps=N["steps"],
            best_val=N["best_val"],
            best_state=N["best_state"],
            es_best=N["es_best"],
            es_bad=N["es_bad"],
            head_model=N["head_model"],
            train_it=N["train_it"],
        )
        env["epochs"] = (
            self.cfgv("epochs", self.epochs) if loop_kind(d) == "epochs" else ""
        )
        env["iters"] = (
            self.cfgv("iters", self.iters) if loop_kind(d) == "iterations" else ""
        )
        env["k"] = self.cfgv("k", self.k) if d["step"] == "accum" else ""
        env["clip"] = self.cfgv("clip", 1.0) if d["step"] == "clip" else ""
        env["patience"] = self.cfgv("patience", 1) if d["step"] == "early_stop" else ""
        lr = self.cfgv("lr", self.lr)

        top = Block()  # module level of the body file, before the body
        body = Block()  # the program's body (top level or inside the main function)
        pre_model = Block()  # model built at module level (site toplevel)

        # seed
        seed_lines = []
        if d["randomness"] == "once":
            seed_lines = [f"torch.manual_seed({self.cfgv('seed', self.seed)})"]
        elif d["randomness"] == "all_libs":
            s = self.cfgv("seed", self.seed)
            seed_lines = [
                f"random.seed({s})",
                f"np.random.seed({s})",
                f"torch.manual_seed({s})",
            ]

        body.add(*seed_lines)
        self.noise(body)
        body.add(*self.outdir_lines())
        # logging / csv set up
        if d["artifacts"] == "logging_file":
            logp = self.path(self.files_out["log"], "log")
            if self.log_basic:
                body.add(f"logging.basicConfig(filename={logp}, level=logging.INFO)")
            else:
                body.add(
                    f"{N['logger']} = logging.getLogger({self.q(self.n.var(1))})",
                    f"{N['logger']}.setLevel(logging.INFO)",
                    f"{N['logger']}.addHandler(logging.FileHandler({logp}))",
                )
                self.body_vars.add(N["logger"])
        if d["artifacts"] == "csv":
            body.add(
                f"{N['csv_f']} = open({self.path(self.files_out['csvlog'], 'csv')}, {self.q('w')}, newline={self.q('')})",
                f"{N['writer']} = csv.writer({N['csv_f']})",
                f"{N['writer']}.writerow([{self.q('step')}, {self.q('loss')}])",
            )
            self.body_vars |= {N["csv_f"], N["writer"]}
        body.add(f"{N['history']} = []")
        self.body_vars.add(N["history"])
        train_src, val_src = self.data_body(body)
        self.noise(body)

        # device
        at_module = site == "toplevel" and entry != "toplevel"
        dev_lines = self.dev_def(at_module)
        if self.needs_dev():
            self.body_vars.add(N["dev"])
        (pre_model if at_module else body).add(*dev_lines)
        env["dev"] = N["dev"]
        env["X"], env["Y"] = N["X"], N["Y"]

        # model, optimizer, scheduler
        model, opt = N["model"], N["opt"]
        if self.uses_crit() and d["loss"] != "bce_prob":
            body.add(f"{N['crit']} = {self.crit_def()}")
            self.body_vars.add(N["crit"])
        sched_needed = (
            d["step"] in ("sched_iter", "sched_epoch") or site == "factory_tuple"
        )
        sched_expr = lambda o: (
            f"torch.optim.lr_scheduler.StepLR({o}, step_size=2, gamma=0.9)"
        )  # noqa: E731
        lib: list[list[str]] = []  # definitions for the helpers module
        lib.append(self.model_classes())
        new_model = f"{C['Net']}()"
        if site == "table":
            top.add(
                f"{N['model'].upper()}_ZOO = {{{self.q(self.table_keys[0])}: {C['Net']}, {self.q(self.table_keys[1])}: {C['Net2']}}}"
            )
            new_model = (
                f"{N['model'].upper()}_ZOO[{self.cfgv('arch', self.trained_arch)}]()"
            )
        mk_opt_target = model
        if site in ("in_main", "toplevel", "table", "teacher", "ema"):
            tgt = pre_model if at_module else body
            tgt.add(
                f"{model} = {new_model}",
                *self.freeze_lines(model),
                *self.place(model, N["dev"]),
            )
            self.body_vars.add(model)
            if site == "teacher":
                t = N["teacher"]
                body.add(
                    f"{t} = {C['Net']}()",
                    f"{t}.eval()",
                    f"{t}.requires_grad_(False)",
                    *self.place(t, N["dev"]),
                )
                self.body_vars.add(t)
            if site == "ema":
                body.add(
                    f"{N['ema']} = copy.deepcopy({model})",
                    f"{N['ema']}.requires_grad_(False)",
                )
                self.body_vars.add(N["ema"])
        elif site == "factory":
            args = ["dev"] if self.needs_dev() else []
            lib.append(
                [
                    f"def {F_['build']}({', '.join(args)}):",
                    f"    net = {new_model}",
                    *["    " + ln for ln in self.freeze_lines("net")],
                    *["    " + ln for ln in self.place("net", "dev")],
                    "    return net",
                ]
            )
            body.add(
                f"{model} = {F_['build']}({', '.join([N['dev']] if args else [])})"
            )
            self.body_vars.add(model)
        elif site in ("factory_tuple", "factory_dict"):
            table = d["optimizer"] == "table"
            args = (
                (["dev"] if self.needs_dev() else [])
                + ["lr"]
                + (["kind"] if table else [])
            )
            call_args = (
                ([N["dev"]] if self.needs_dev() else [])
                + [lr]
                + ([self.cfgv("opt", self.trained_opt)] if table else [])
            )
            L = [
                f"def {F_['build']}({', '.join(args)}):",
                f"    net = {new_model}",
                *["    " + ln for ln in self.freeze_lines("net")],
                *["    " + ln for ln in self.place("net", "dev")],
                f"    opt = {self.opt_expr('net', 'lr', kind='kind')}",
            ]
            inner = "opt." + A["inner"] if d["optimizer"] == "holder_class" else "opt"
            if site == "factory_tuple":
                L += [f"    sched = {sched_expr(inner)}", "    return net, opt, sched"]
                body.add(
                    f"{model}, {opt}, {N['sched']} = {F_['build']}({', '.join(call_args)})"
                )
                self.body_vars |= {model, opt, N["sched"]}
            else:
                k1, k2 = self.dict_keys
                L += [f"    return {{{self.q(k1)}: net, {self.q(k2)}: opt}}"]
                body.add(
                    f"{N['built']} = {F_['build']}({', '.join(call_args)})",
                    f"{model} = {N['built']}[{self.q(k1)}]",
                    f"{opt} = {N['built']}[{self.q(k2)}]",
                )
                self.body_vars |= {N["built"], model, opt}
            lib.append(L)
        elif site == "two_models":
            a, hm = N["enc"], N["head_model"]
            body.add(
                f"{a} = {C['Enc']}()",
                f"{hm} = {C['Head']}()",
                *self.place(a, N["dev"]),
                *self.place(hm, N["dev"]),
            )
            self.body_vars |= {a, hm}
        # optimizer (outside factories and trainer)
        if site not in ("factory_tuple", "factory_dict", "trainer"):
            if site == "two_models":
                if d["step"] == "two_opts":
                    cls = f"torch.optim.{self.opt_kind}"
                    body.add(
                        f"{opt} = {cls}({N['enc']}.parameters(), lr={lr})",
                        f"{N['opt2']} = {cls}({N['head_model']}.parameters(), lr={lr})",
                    )
                    self.body_vars |= {opt, N["opt2"]}
                else:
                    body.add(f"{opt} = {self.opt_expr(N['enc'], lr, N['head_model'])}")
                    self.body_vars.add(opt)
            elif d["step"] == "two_opts":
                cls = f"torch.optim.{self.opt_kind}"
                body.add(
                    f"{opt} = {cls}({model}.{A['body']}.parameters(), lr={lr})",
                    f"{N['opt2']} = {cls}({model}.{A['head']}.parameters(), lr={lr})",
                )
                self.body_vars |= {opt, N["opt2"]}
            else:
                body.add(f"{opt} = {self.opt_expr(mk_opt_target, lr)}")
                self.body_vars.add(opt)
            if sched_needed:
                body.add(f"{N['sched']} = {sched_expr(self.inner_opt(env))}")
                self.body_vars.add(N["sched"])
        elif site == "factory_dict" and sched_needed:
            body.add(f"{N['sched']} = {sched_expr(self.inner_opt(env))}")
            self.body_vars.add(N["sched"])
        if d["device"] == "dataparallel":
            with body.open("if torch.cuda.device_count() > 1:"):
                body.add(f"{model} = nn.DataParallel({model})")
        # precision
        if d["precision"] != "none":
            body.add(f"{N['use_amp']} = torch.cuda.is_available()")
            self.body_vars.add(N["use_amp"])
            if d["precision"] == "amp_scaler":
                body.add(
                    f"{N['scaler']} = torch.amp.GradScaler({self.q('cuda')}, enabled={N['use_amp']})"
                )
                self.body_vars.add(N["scaler"])
            elif d["precision"] == "legacy_cuda_amp":
                body.add(
                    f"{N['scaler']} = torch.cuda.amp.GradScaler(enabled={N['use_amp']})"
                )
                self.body_vars.add(N["scaler"])
        if d["forward"] == "partial" and not trainer:
            mods = [N["enc"], N["head_model"]] if site == "two_models" else [model]
            args = mods + ([N["teacher"]] if site == "teacher" else []) + [N["crit"]]
            body.add(
                f"{N['fwd']} = functools.partial({F_['step_fn']}, {', '.join(args)})"
            )
            self.body_vars.add(N["fwd"])

        # trainer: model, optimizer and loop in a class
        tr = N["trainer"]
        if trainer:
            tenv = dict(env)
            tenv.update(
                model=f"self.{A['net']}",
                opt=f"self.{A['opt']}",
                sched=f"self.{A['sched']}",
                steps=f"self.{A['steps']}",
                best_val=f"self.{A['best_val']}",
                best_state=f"self.{A['best_state']}",
                es_best=f"self.{A['es_best']}",
                es_bad=f"self.{A['es_bad']}",
            )
            if d["forward"] == "partial":
                tenv["fwd"] = "self.fwd"
            tb = Block()
            init_args = (
                (["dev"] if self.needs_dev() else [])
                + ["lr"]
                + (["crit"] if self.uses_crit() else [])
                + (["kind"] if d["optimizer"] == "table" else [])
            )
            with tb.open(f"class {C['Trainer']}:"):
                with tb.open(f"def __init__(self, {', '.join(init_args)}):"):
                    tb.add(
                        f"self.{A['net']} = {new_model}",
                        *self.freeze_lines(f"self.{A['net']}"),
                        *self.place(f"self.{A['net']}", "dev"),
                    )
                    tb.add(
                        f"self.{A['opt']} = {self.opt_expr('self.' + A['net'], 'lr', kind='kind')}"
                    )
                    if self.uses_crit():
                        tb.add("self.crit = crit")
                    if sched_needed:
                        tb.add(f"self.{A['sched']} = {sched_expr('self.' + A['opt'])}")
                    tb.add(
                        f"self.{A['steps']} = 0",
                        f"self.{A['best_val']} = float({self.q('inf')})",
                        f"self.{A['best_state']} = None",
                        f"self.{A['es_best']} = float({self.q('inf')})",
                        f"self.{A['es_bad']} = 0",
                    )
                    if d["forward"] == "partial":
                        tb.add(
                            f"self.fwd = functools.partial({F_['step_fn']}, self.{A['net']}, self.crit)"
                        )
                tb.add("")
                # the loop text decides the fit() parameters
                tenv["crit"] = "self.crit"
                loop = self.outer_loop(tenv, train_src, val_src)
                fit_args = self.free_vars(loop.text())
                with tb.open(
                    f"def {F_['fit']}(self{''.join(', ' + a for a in fit_args)}):"
                ):
                    tb.extend(loop)
            top.extend(tb)
            top.add("", "")
            call_init = (
                ([N["dev"]] if self.needs_dev() else [])
                + [lr]
                + ([N["crit"]] if self.uses_crit() else [])
                + (
                    [self.cfgv("opt", self.trained_opt)]
                    if d["optimizer"] == "table"
                    else []
                )
            )
            body.add(f"{tr} = {C['Trainer']}({', '.join(call_init)})")
            self.body_vars.add(tr)
            env = dict(
                env,
                model=f"{tr}.{A['net']}",
                opt=f"{tr}.{A['opt']}",
                steps=f"{tr}.{A['steps']}",
                best_state=f"{tr}.{A['best_state']}",
            )
            loop_call = f"{tr}.{F_['fit']}({', '.join(fit_args)})"
        # resume
        rs = d["resume"]
        P = self.primary(env) if site != "two_models" else N["enc"]
        if rs == "init_roundtrip":
            ip = self.path(self.files_out["init"], "pt")
            body.add(
                f"torch.save({P}.state_dict(), {ip})",
                f"{P}.load_state_dict(torch.load({ip}, map_location={self.q('cpu')}))",
            )
        elif rs in ("if_present", "flag"):
            ck = N["ck"]
            if rs == "if_present":
                body.add(f"{ck} = {self.path(self.files_out['model'], 'pt')}")
                cond = f"os.path.exists({ck})"
            else:
                body.add(f"{ck} = {self.cfgv('resume', '')}")
                cond = f"{ck} and os.path.exists({ck})"
            self.body_vars.add(ck)
            fmt = d["checkpoint"]
            load = {
                "state_dict": f"torch.load({ck}, map_location={self.q('cpu')})",
                "dict_with_object": f"torch.load({ck}, map_location={self.q('cpu')}, weights_only=False)[{self.q('model')}].state_dict()",
                "whole_model": f"torch.load({ck}, map_location={self.q('cpu')}, weights_only=False).state_dict()",
            }[fmt]
            with body.open(f"if {cond}:"):
                body.add(f"{P}.load_state_dict({load})", f"print({self.q('resumed')})")
        # counters and the loop
        if not trainer:
            body.add(f"{N['steps']} = 0")
            self.body_vars.add(N["steps"])
            if d["evaluation"] == "best_copy":
                body.add(
                    f"{N['best_val']}, {N['best_state']} = float({self.q('inf')}), None"
                )
                self.body_vars |= {N["best_val"], N["best_state"]}
            if d["step"] == "early_stop":
                body.add(f"{N['es_best']}, {N['es_bad']} = float({self.q('inf')}), 0")
                self.body_vars |= {N["es_best"], N["es_bad"]}
        self.noise(body)
        if trainer:
            body.add(loop_call)
        else:
            if d["loop_form"] == "epoch_fn":
                inner = self.inner_epoch(env, train_src)
                inner.add(f"return {N['epoch_loss']}, {N['steps']}")
                args = self.free_vars(inner.text())
                if N["steps"] not in args:
                    args.append(N["steps"])
                self._epoch_fn_args = args
                fb = Block()
                with fb.open(f"def {F_['train_epoch']}({', '.join(args)}):"):
                    fb.extend(inner)
                top.extend(fb)
                top.add("", "")
            body.extend(self.outer_loop(env, train_src, val_src))
        # after training
        if d["evaluation"] == "end_only":
            body.add(
                f"{N['val']} = {self.eval_call(env, val_src)}",
                f"print({self.fq('final val {' + N['val'] + ':.4f}')})",
            )
        ck = d["checkpoint"]
        mp = self.path(self.files_out["model"], "pt")
        if ck == "state_dict":
            body.add(f"torch.save({self.state_of(env)}, {mp})")
        elif ck == "dict_with_object":
            objs = (
                f"{self.q('enc')}: {N['enc']}, {self.q('head')}: {N['head_model']}"
                if site == "two_models"
                else f"{self.q('model')}: {self.primary(env)}"
            )
            ep_v = env["epochs"] or env["iters"]
            body.add(
                f"torch.save({{{objs}, {self.q('epoch')}: {ep_v}, {self.q('optimizer')}: {self.inner_opt(env)}.state_dict()}}, {mp})"
            )
        elif ck == "whole_model":
            body.add(f"torch.save({self.primary(env)}, {mp})")
        if site == "ema" and ck != "none":
            body.add(
                f"torch.save({N['ema']}.state_dict(), {self.path(self.files_out['ema'], 'pt')})"
            )
        if d["evaluation"] == "best_copy":
            with body.open(f"if {env['best_state']} is not None:"):
                body.add(
                    f"torch.save({env['best_state']}, {self.path(self.files_out['best'], 'pt')})"
                )
        hist = N["history"]
        art = d["artifacts"]
        fh = N["fh"]
        if art == "numpy":
            body.add(
                f"np.save({self.path(self.files_out['hist'], 'npy')}, np.array({hist}))"
            )
        elif art == "pickle":
            with body.open(
                f"with open({self.path(self.files_out['hist'], 'pkl')}, {self.q('wb')}) as {fh}:"
            ):
                body.add(f"pickle.dump({{{self.q('history')}: {hist}}}, {fh})")
        elif art == "json":
            with body.open(
                f"with open({self.path(self.files_out['metrics'], 'json')}, {self.q('w')}) as {fh}:"
            ):
                body.add(
                    f"json.dump({{{self.q('final')}: {hist}[-1], {self.q('history')}: {hist}}}, {fh})"
                )
        elif art == "csv":
            body.add(f"{N['csv_f']}.close()")
        elif art == "fake_lib":
            body.add(
                f"{self.M['fakelib']}.{F_['plot_fn']}({hist}, {self.path(self.files_out['curve'], 'svg')})"
            )
        elif art == "nopkg_helper":
            body.add(
                f"{F_['writer_fn']}({self.path(self.files_out['dump'], 'txt')}, {hist})"
            )
        # the self-check line (the oracle does not rely on it)
        for i, m in enumerate(self.trained(env)):
            body.add(
                f"print({self.q('checksum')}, {i}, float(sum(p.detach().double().sum() for p in {m}.parameters())), "
                f"{self.q('steps')}, {env['steps']}, file=sys.stderr)"
            )

        # ---- library definitions (helpers module or the entry file) ----
        lib.append(self.data_lib_defs())
        lib.append(self.opt_lib_defs())
        lib.append(self.step_helper_def())
        lib.append(self.eval_def())
        lib.append(self.ema_def())
        lib.append(self.crit_lib_def())
        lib_text = "\n\n\n".join("\n".join(x).rstrip() for x in lib if x)
        lib_names = sorted(set(re.findall(r"^(?:def|class) (\w+)", lib_text, re.M)))
        top_text = top.text()
        if d["optimizer"] == "table":
            top_text = "\n".join(self.opt_table_def()) + "\n\n" + top_text
            if site in ("factory_tuple", "factory_dict"):
                # the factory reads the table: it lives with the factory
                lib_text = "\n".join(self.opt_table_def()) + "\n\n\n" + lib_text
                lib_names.append(f"{N['opt'].upper()}S")
        lib_text = self.rename_locals(lib_text)
        top_text = self.rename_locals(top_text)
        return self.assemble(body, top_text, pre_model, lib_text, lib_names)

    def assemble(
        self,
        body: Block,
        top_text: str,
        pre_model: Block,
        lib_text: str,
        lib_names: list[str],
    ) -> Program:
        d, M = self.d, self.M
        entry, layout = d["entry"], d["layout"]
        files: dict[str, str] = {}
        pkg = M["pkg"]
        # where the body lives
        if entry == "module":
            body_file, body_mod = f"{pkg}/{M['entry']}.py", f"{pkg}.{M['entry']}"
        elif entry == "console":
            body_file, body_mod = f"{pkg}/{M['body_mod']}.py", f"{pkg}.{M['body_mod']}"
        else:
            body_file, body_mod = f"{M['entry']}.py", M["entry"]
        # where the library lives
        if layout == "single":
            lib_file, lib_mod = None, None
        elif layout == "sibling":
            lib_file = f"{M['helpers']}.py"
            lib_mod = M["helpers"]
        elif layout == "package":
            lib_file, lib_mod = f"{pkg}/{M['helpers']}.py", f"{pkg}.{M['helpers']}"
        else:
            lib_file, lib_mod = (
                f"{M['nsdir']}/{M['helpers']}.py",
                f"{M['nsdir']}.{M['helpers']}",
            )
        if layout == "package" or entry in ("module", "console"):
            files[f"{pkg}/__init__.py"] = self.rng.choice(
                ["", '"""The training code."""\n']
            )
        # helper writers of the artifacts
        if d["artifacts"] == "fake_lib":
            lib_dir = M["fakelib"]
            files[f"{lib_dir}/{M['fakecore']}.py"] = (
                f"def {self.F['plot_fn']}(values, path, width=200, height=100):\n"
                f"    top = max(values) if values else 1.0\n"
                f'    pts = " ".join(f"{{i * width / max(len(values) - 1, 1):.1f}},{{height - v / (top or 1.0) * height:.1f}}" for i, v in enumerate(values))\n'
                f'    with open(path, "w") as f:\n'
                f'        f.write(f\'<svg xmlns="http://www.w3.org/2000/svg"><polyline points="{{pts}}"/></svg>\')\n'
            )
            files[f"{lib_dir}/__init__.py"] = (
                f'from .{M["fakecore"]} import {self.F["plot_fn"]}\n\n__version__ = "0.{self.rng.randrange(9)}"\n'
            )
        if d["artifacts"] == "nopkg_helper":
            nd = M["nsdir"] + "_io"
            files[f"{nd}/{M['nsmod']}.py"] = (
                f'def {self.F["writer_fn"]}(path, values):\n    with open(path, "w") as out:\n'
                f'        for v in values:\n            out.write(f"{{v}}\\n")\n'
            )
        if d["config"] == "settings_module":
            files[f"{M['settings']}.py"] = (
                "\n".join(
                    f"{self.key[k].upper()} = {self.lit(v)}"
                    for k, v in self.cfg_used.items()
                )
                + "\n"
            )
        if d["config"] == "json_file":
            files[f"{self.files_out['cfgjson']}.json"] = (
                json.dumps({self.key[k]: v for k, v in self.cfg_used.items()}, indent=2)
                + "\n"
            )
        if entry == "clilib":
            files[f"{M['clilib']}/__init__.py"] = (
                "import sys\n\n_COMMANDS = {}\n\n\n"
                f"def {self.F['cli_cmd']}(fn):\n    _COMMANDS[fn.__name__] = fn\n    return fn\n\n\n"
                f"def {self.F['cli_launch']}(argv=None):\n    argv = sys.argv[1:] if argv is None else argv\n"
                "    name = argv[0] if argv and argv[0] in _COMMANDS else next(iter(_COMMANDS))\n    return _COMMANDS[name]()\n"
            )
        # the body file
        body_text = body.text()
        head = ["import os", "import sys"]
        cfg_body = self.config_body()
        full_for_imports = (
            "\n".join(cfg_body + self.config_module_level())
            + "\n"
            + body_text
            + "\n"
            + top_text
            + "\n"
            + pre_model.text()
            + ("" if lib_file else "\n" + lib_text)
        )
        head += self.imports_for(full_for_imports)
        if d["artifacts"] == "fake_lib":
            head.append(f"import {M['fakelib']}")
        if d["artifacts"] == "nopkg_helper":
            head.append(
                f"from {M['nsdir']}_io.{M['nsmod']} import {self.F['writer_fn']}"
            )
        if d["config"] == "settings_module":
            head.append(f"import {M['settings']}")
        if entry == "clilib":
            head.append(f"import {M['clilib']}")
        if lib_file:
            used = [
                n
                for n in lib_names
                if re.search(
                    rf"(?<![.\w]){re.escape(n)}\b",
                    body_text + top_text + pre_model.text(),
                )
            ]
            if used:
                head.append(f"from {lib_mod} import {', '.join(used)}")
            files[lib_file] = self.file_text(self.imports_for(lib_text), lib_text)
        parts = ["\n".join(head)]
        cfg_mod = self.config_module_level()
        if cfg_mod:
            parts.append("\n".join(cfg_mod))
        if not lib_file:
            parts.append(lib_text)
        if top_text.strip():
            parts.append(top_text.rstrip())
        if pre_model.lines:
            parts.append(pre_model.text())
        main = self.F["main"]
        if entry == "toplevel":
            parts.append("\n".join(cfg_body + [body_text]))
        else:
            b = Block()
            if entry == "clilib":
                b.add(f"@{M['clilib']}.{self.F['cli_cmd']}")
            with b.open(f"def {main}():"):
                if self.rng.random() < 0.3:
                    b.add(
                        f'"""{self.rng.choice(["Train.", "Entry point.", "Run one experiment."])}"""'
                    )
                b.add(*cfg_body)
                b.extend(body)
            parts.append(b.text())
            if entry in ("main_guard", "module"):
                parts.append(f"if __name__ == {self.q('__main__')}:\n    {main}()")
            elif entry == "clilib":
                parts.append(
                    f"if __name__ == {self.q('__main__')}:\n    {M['clilib']}.{self.F['cli_launch']}()"
                )
        files[body_file] = (
            "\n\n\n".join(p.strip("\n") for p in parts if p.strip()) + "\n"
        )
        argv_tail = self.argv_extra()
        if entry == "module":
            argv = ["-m", body_mod] + argv_tail
            entry_file = body_file
        elif entry == "console":
            thin = f"{M['thin']}.py"
            call = self.rng.choice([f"{main}()", f"sys.exit({main}())"])
            files[thin] = (
                f"import sys\n\nfrom {body_mod} import {main}\n\nif __name__ == {self.q('__main__')}:\n    {call}\n"
            )
            files["pyproject.toml"] = (
                f'[project]\nname = "{pkg}"\nversion = "0.1"\n\n[project.scripts]\n'
                f'{pkg}-train = "{body_mod}:{main}"\n'
            )
            argv = [thin] + argv_tail
            entry_file = thin
        else:
            argv = [body_file] + argv_tail
            entry_file = body_file
        return Program(
            dict(self.d),
            "",
            files,
            argv,
            entry_file,
            loop_kind(d),
            expected_steps(d),
            d["randomness"] != "none",
        )

    _LOCALS = [
        "net",
        "enc",
        "head",
        "crit",
        "batches",
        "a",
        "b",
        "out",
        "loss",
        "kind",
        "size",
        "tr",
        "va",
        "avg",
        "cur",
        "total",
        "count",
        "order",
        "inp",
        "target",
        "t",
        "opt",
        "sched",
        "pa",
        "pc",
        "j",
        "h",
        "n",
        "i",
        "batch",
        "params",
        "lr",
        "dev",
        "x",
        "y",
    ]

    def rename_locals(self, text: str) -> str:
        """Parameter and local names of the helpers, drawn at random too (a keyword argument in a
        call, `lr=lr`, keeps its keyword; a parameter with a default keeps its name)."""
        for name in self._LOCALS:
            if re.search(rf"^\s*def .*[(, ]{name}=", text, re.M):
                continue
            new = self.n.var(1)
            text = re.sub(rf"(?<![\w.'\"]){name}\b(?![\'\"])(?!=[^=])", new, text)
        return text

    def imports_for(self, text: str) -> list[str]:
        out = []
        checks = [
            ("argparse.", "import argparse"),
            ("copy.", "import copy"),
            ("csv.", "import csv"),
            ("functools.", "import functools"),
            ("itertools.", "import itertools"),
            ("json.", "import json"),
            ("logging.", "import logging"),
            ("pickle.", "import pickle"),
            ("random.seed", "import random"),
            ("time.", "import time"),
            ("@dataclass", "from dataclasses import dataclass"),
            ("Path(", "from pathlib import Path"),
            ("np.", "import numpy as np"),
        ]
        for needle, line in checks:
            if needle in text and line not in out:
                out.append(line)
        out.append("import torch")
        if "nn." in text:
            out.append("import torch.nn as nn")
        if "F." in text:
            out.append("import torch.nn.functional as F")
        data_names = [
            n
            for n in (
                "DataLoader",
                "Dataset",
                "IterableDataset",
                "TensorDataset",
                "Subset",
                "random_split",
                "Sampler",
            )
            if re.search(rf"(?<![.\w]){n}\b", text)
        ]
        if data_names:
            out.append(f"from torch.utils.data import {', '.join(data_names)}")
        return out

    def file_text(self, imports: list[str], text: str) -> str:
        return (
            "\n".join(["import os", "import sys"] + imports)
            + "\n\n\n"
            + text.strip("\n")
            + "\n"
        )


def generate(dims: dict[str, str], name_seed: str) -> Program:
    prog = Gen(dims, name_seed).build()
    prog.name_seed = name_seed
    return prog


def case_seed(seed: int, index: int) -> tuple[random.Random, str]:
    """The random stream that draws case `index` of run `seed`, and its name seed."""
    return random.Random(f"shapes:{seed}:{index}"), f"names:{seed}:{index}"


def draw(seed: int, index: int) -> Program:
    from grammar import sample

    rng, name_seed = case_seed(seed, index)
    return generate(sample(rng), name_seed)


if __name__ == "__main__":  # python gen.py SEED INDEX: print a generated program
    import sys

    p = draw(int(sys.argv[1]), int(sys.argv[2]))
    print(json.dumps(p.dims), p.argv, p.steps)
    for rel, text in p.files.items():
        print(f"==> {rel}\n{text}")
