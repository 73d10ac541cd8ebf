"""Generate the converter-speed corpus: >= 200 single-GPU training scripts.

    python bench/converter/make_corpus.py OUT_DIR [--count 240] [--seed 0]

Sources: every fixtures/*/input.py and bench/gpu/*_single.py, each written as is and in
four variations (identifiers renamed, top-level functions reordered, unrelated helper
code added, all three together), then scripts assembled from templates with varied
model, data, loader, optimizer, scheduler, precision, loop and program-structure styles
until --count files exist. Also writes OUT_DIR/precommit_300.py, a ~300-line script for
the pre-commit timing. Every file is checked to compile. The corpus is generated, never
committed: write it to a temporary directory.
"""

from __future__ import annotations

import argparse
import random
import sys
import textwrap
from pathlib import Path

import libcst as cst

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- variations of real scripts

RENAMES = {
    "model": "net",
    "optimizer": "opt",
    "train_loader": "loader_train",
    "test_loader": "loader_eval",
    "loader": "batches",
    "device": "dev",
    "epoch": "ep",
    "criterion": "loss_fn",
    "loss": "batch_loss",
    "args": "cfg",
    "data": "inputs_batch",
    "target": "labels_batch",
    "scheduler": "lr_sched",
    "dataset": "train_data",
}


class _Rename(cst.CSTTransformer):
    """Renames variables; attribute names, call keywords and imported names keep theirs."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def leave_Name(self, original, updated):
        new = self.mapping.get(updated.value)
        return updated.with_changes(value=new) if new else updated

    def leave_Attribute(self, original, updated):
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)

    def leave_ImportAlias(self, original, updated):
        return original

    def leave_ImportFrom(self, original, updated):
        return updated.with_changes(module=original.module)


def _names(module: cst.Module) -> set[str]:
    found: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, node):
            found.add(node.value)

    module.visit(V())
    return found


def rename(src: str) -> str:
    module = cst.parse_module(src)
    used = _names(module)
    # Only names present, and only to names not already taken.
    mapping = {a: b for a, b in RENAMES.items() if a in used and b not in used}
    return module.visit(_Rename(mapping)).code


def reorder(src: str) -> str:
    """Reverse each run of consecutive top-level function definitions (safe: defs run nothing)."""
    module = cst.parse_module(src)
    body, run, out = list(module.body), [], []
    for stmt in body + [None]:
        if isinstance(stmt, cst.FunctionDef):
            run.append(stmt)
            continue
        out.extend(reversed(run))
        run = []
        if stmt is not None:
            out.append(stmt)
    return module.with_changes(body=out).code


HELPERS = [
    '''
class AverageMeter:
    """Running average of a scalar."""

    def __init__(self):
        self.total = 0.0
        self.count = 0

    def update(self, value, n=1):
        self.total += value * n
        self.count += n

    @property
    def avg(self):
        return self.total / max(1, self.count)
''',
    """
def seed_everything(seed=0):
    import random as _random

    _random.seed(seed)
    torch.manual_seed(seed)
""",
    """
def format_seconds(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{seconds:02d}"
""",
    """
def count_parameters(module):
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
""",
    """
def describe_config(config):
    width = max(len(str(k)) for k in config) if config else 0
    return "\\n".join(f"{str(k).ljust(width)} = {v}" for k, v in sorted(config.items()))
""",
    """
def linear_warmup(step, warmup_steps, base_lr):
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    return base_lr
""",
    """
class EarlyStopper:
    def __init__(self, patience=3, min_delta=0.0):
        self.patience = patience
        self.min_delta = min_delta
        self.best = float("inf")
        self.bad_epochs = 0

    def should_stop(self, value):
        if value < self.best - self.min_delta:
            self.best = value
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs > self.patience
""",
    """
def accuracy(logits, labels):
    return (logits.argmax(dim=-1) == labels).float().mean().item()
""",
    """
LABEL_NAMES = [f"class_{i}" for i in range(10)]
DEFAULT_HPARAMS = {"lr": 1e-3, "batch_size": 64, "epochs": 5, "weight_decay": 0.0}
""",
    """
def moving_average(values, window=5):
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out
""",
]


def pad(src: str, rng: random.Random, n: int = 3) -> str:
    """Insert unrelated helpers after the imports and before the entry point."""
    module = cst.parse_module(src)
    body = list(module.body)
    first = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom, cst.Expr)) for s in stmt.body
        ):
            first = i + 1
        else:
            break
    picks = rng.sample(HELPERS, n)
    head = list(cst.parse_module(picks[0]).body)
    tail = [s for h in picks[1:] for s in cst.parse_module(h).body]
    end = len(body)
    if body and isinstance(body[-1], cst.If):
        end -= 1  # keep `if __name__ == "__main__":` last
    body = body[:first] + head + body[first:end] + tail + body[end:]
    return module.with_changes(body=body).code


# ---------------------------------------------------------------- template scripts

MODELS = {
    "mlp": (
        """
class {cls}(nn.Module):
    def __init__(self, in_dim={dim}, hidden={hidden}, classes={classes}):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)
""",
        "torch.randn({n}, {dim})",
    ),
    "cnn": (
        """
class {cls}(nn.Module):
    def __init__(self, classes={classes}):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))
""",
        "torch.randn({n}, 3, 32, 32)",
    ),
    "rnn": (
        """
class {cls}(nn.Module):
    def __init__(self, vocab=1000, emb=64, hidden={hidden}, classes={classes}):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(hidden, classes)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))
        return self.out(h[:, -1])
""",
        "torch.randint(0, 1000, ({n}, 24))",
    ),
    "transformer": (
        """
class {cls}(nn.Module):
    def __init__(self, vocab=1000, width=64, heads=4, layers=2, classes={classes}):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))
""",
        "torch.randint(0, 1000, ({n}, 32))",
    ),
}

OPTIMIZERS = [
    "torch.optim.SGD({m}.parameters(), lr={lr}, momentum=0.9)",
    "torch.optim.SGD({m}.parameters(), lr={lr}, momentum=0.9, nesterov=True, weight_decay=5e-4)",
    "torch.optim.Adam({m}.parameters(), lr={lr})",
    "optim.AdamW({m}.parameters(), lr={lr}, weight_decay=0.05)",
    "optim.RMSprop({m}.parameters(), lr={lr}, alpha=0.9)",
    "torch.optim.AdamW([p for p in {m}.parameters() if p.requires_grad], lr={lr}, betas=(0.9, 0.95))",
]

SCHEDULERS = [
    None,
    "StepLR({o}, step_size=2, gamma=0.5)",
    "CosineAnnealingLR({o}, T_max=EPOCHS)",
    "torch.optim.lr_scheduler.ExponentialLR({o}, gamma=0.9)",
]

LOADERS = [
    "DataLoader({ds}, batch_size={bs}, shuffle=True)",
    "DataLoader({ds}, batch_size={bs}, shuffle=True, num_workers=2, pin_memory=True)",
    "DataLoader({ds}, {bs}, True)",
    "DataLoader(dataset={ds}, batch_size={bs}, shuffle=True, drop_last=True, persistent_workers=False)",
    "torch.utils.data.DataLoader({ds}, batch_size={bs}, shuffle=True, num_workers=0)",
]

LOSSES = [
    "nn.CrossEntropyLoss()",
    "nn.CrossEntropyLoss(label_smoothing=0.1)",
    "F.cross_entropy",
]


def template_script(rng: random.Random, index: int, big: bool = False) -> str:
    kind = rng.choice(list(MODELS))
    cls = rng.choice(["Net", "Classifier", "Model", f"{kind.capitalize()}Net"])
    m = rng.choice(["model", "net", "network", "clf"])
    o = rng.choice(["optimizer", "opt", "optim_"])
    loader = rng.choice(["train_loader", "loader", "train_dl", "dl"])
    dev = rng.choice(["device", "dev", "DEVICE"])
    x, y = rng.choice(
        [("x", "y"), ("inputs", "targets"), ("data", "target"), ("batch_x", "batch_y")]
    )
    classes = rng.choice([2, 5, 10, 100])
    n = rng.choice([256, 512, 1024])
    bs = rng.choice([16, 32, 64, 128])
    lr = rng.choice(["1e-3", "3e-4", "0.01", "0.1"])
    amp = "bf16" if big else rng.choice(["none", "none", "bf16", "fp16"])
    sched = "StepLR({o}, step_size=2, gamma=0.5)" if big else rng.choice(SCHEDULERS)
    structure = "train_fn" if big else rng.choice(["toplevel", "main", "train_fn"])
    config = "argparse" if big else rng.choice(["constants", "argparse", "dataclass"])
    accum = big or rng.random() < 0.2
    clip = big or rng.random() < 0.4
    evaluate = big or rng.random() < 0.5
    save = big or rng.random() < 0.5
    tqdm_bar = big or rng.random() < 0.3
    model_src, data_expr = MODELS[kind]
    fmt = dict(
        cls=cls,
        dim=rng.choice([16, 32, 64]),
        hidden=rng.choice([64, 128, 256]),
        classes=classes,
        n=n,
    )

    imports = [
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "import torch.optim as optim",
    ]
    imports.append("from torch.utils.data import DataLoader, TensorDataset")
    if sched and "StepLR" in sched or sched and "Cosine" in sched:
        imports.append("from torch.optim.lr_scheduler import CosineAnnealingLR, StepLR")
    if config == "argparse":
        imports.insert(0, "import argparse")
    if config == "dataclass":
        imports.insert(0, "from dataclasses import dataclass")
    if tqdm_bar:
        imports.append("from tqdm import tqdm")
    if save:
        imports.insert(0, "import os")

    parts = [
        f'"""Generated training script #{index}: {kind} model, {config} config, {structure} layout."""',
        "",
    ]
    parts += imports + ["", ""]
    if config == "constants":
        parts += [
            f"EPOCHS = {rng.choice([2, 3, 5])}",
            f"BATCH_SIZE = {bs}",
            f"LR = {lr}",
            "",
            "",
        ]
        epochs, bsz, lr_expr = "EPOCHS", "BATCH_SIZE", "LR"
    elif config == "dataclass":
        parts += [
            "@dataclass",
            "class Config:",
            f"    epochs: int = {rng.choice([2, 3, 5])}",
            f"    batch_size: int = {bs}",
            f"    lr: float = {lr}",
            "    seed: int = 0",
            "",
            "",
            "EPOCHS = Config.epochs",
            "",
            "",
        ]
        epochs, bsz, lr_expr = "cfg.epochs", "cfg.batch_size", "cfg.lr"
    else:
        parts += ["EPOCHS = 3", "", ""]
        epochs, bsz, lr_expr = "args.epochs", "args.batch_size", "args.lr"
    parts += [textwrap.dedent(model_src.format(**fmt)).strip(), "", ""]

    loss_ctor = rng.choice(LOSSES)
    crit = "F.cross_entropy" if loss_ctor == "F.cross_entropy" else "criterion"
    opt_expr = rng.choice(OPTIMIZERS).format(m=m, lr=lr_expr)
    loader_expr = rng.choice(LOADERS).format(ds="train_set", bs=bsz)

    setup = [
        "torch.manual_seed(0)",
        f'{dev} = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        f"features = {data_expr.format(n=n, dim=fmt['dim'])}",
        f"labels = torch.randint(0, {classes}, ({n},))",
        "train_set = TensorDataset(features, labels)",
        f"{loader} = {loader_expr}",
        f"{m} = {cls}().to({dev})",
        f"{o} = {opt_expr}",
    ]
    if crit == "criterion":
        setup.append(f"criterion = {loss_ctor}")
    if sched:
        setup.append(f"scheduler = {sched.format(o=o)}")
    if amp == "fp16":
        setup.append(
            'scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())'
        )
    if evaluate:
        setup += [
            f"val_features = {data_expr.format(n=n // 4, dim=fmt['dim'])}",
            f"val_labels = torch.randint(0, {classes}, ({n // 4},))",
            f"val_loader = DataLoader(TensorDataset(val_features, val_labels), batch_size={bsz})",
        ]

    it = f'tqdm({loader}, desc=f"epoch {{epoch}}")' if tqdm_bar else loader
    step = [f"{x}, {y} = {x}.to({dev}), {y}.to({dev})"]
    fwd = [f"out = {m}({x})", f"loss = {crit}(out, {y})"]
    if accum:
        fwd.append("loss = loss / ACCUM_STEPS")
    if amp == "bf16":
        step += [
            f"with torch.autocast(device_type={dev}.type, dtype=torch.bfloat16):"
        ] + ["    " + ln for ln in fwd]
    elif amp == "fp16":
        step += [
            f"with torch.autocast(device_type={dev}.type, dtype=torch.float16, enabled=torch.cuda.is_available()):"
        ] + ["    " + ln for ln in fwd]
    else:
        step += fwd
    update = []
    if amp == "fp16":
        update += ["scaler.scale(loss).backward()"]
        if clip:
            update += [
                f"scaler.unscale_({o})",
                f"nn.utils.clip_grad_norm_({m}.parameters(), 1.0)",
            ]
        update += [f"scaler.step({o})", "scaler.update()", f"{o}.zero_grad()"]
    else:
        update += ["loss.backward()"]
        if clip:
            update += [
                f"torch.nn.utils.clip_grad_norm_({m}.parameters(), max_norm=1.0)"
            ]
        update += [f"{o}.step()", f"{o}.zero_grad(set_to_none=True)"]
    if accum:
        body = (
            step
            + [update[0], "if (i + 1) % ACCUM_STEPS == 0:"]
            + ["    " + u for u in update[1:]]
        )
        loop_head = f"for i, ({x}, {y}) in enumerate({it}):"
    else:
        body = step + update
        loop_head = f"for {x}, {y} in {it}:"
    body += ["running += loss.item()"]
    if tqdm_bar:
        body += []
    epoch_loop = [
        f"for epoch in range({epochs}):",
        f"    {m}.train()",
        "    running = 0.0",
        f"    {loop_head}",
    ]
    epoch_loop += ["        " + b for b in body]
    if sched:
        epoch_loop += ["    scheduler.step()"]
    epoch_loop += [
        f'    print(f"epoch {{epoch}}: train loss {{running / len({loader}):.4f}}")'
    ]
    if evaluate:
        epoch_loop += [
            f"    acc = evaluate({m}, val_loader, {dev})",
            '    print(f"epoch {epoch}: val acc {acc:.3f}")',
        ]
    if save:
        epoch_loop += [
            '    os.makedirs("checkpoints", exist_ok=True)',
            f'    torch.save({{"model": {m}.state_dict(), "optimizer": {o}.state_dict(), "epoch": epoch}}, "checkpoints/last.pt")',
        ]

    if accum:
        parts += ["ACCUM_STEPS = 4", ""]
    if evaluate:
        parts += [
            "def evaluate(model, loader, device):",
            "    model.eval()",
            "    correct = total = 0",
            "    with torch.no_grad():",
            "        for inputs, labels in loader:",
            "            inputs, labels = inputs.to(device), labels.to(device)",
            "            preds = model(inputs).argmax(dim=1)",
            "            correct += (preds == labels).sum().item()",
            "            total += labels.numel()",
            "    return correct / max(1, total)",
            "",
            "",
        ]
    if config == "argparse":
        parts += [
            "def parse_args():",
            '    parser = argparse.ArgumentParser(description="training")',
            '    parser.add_argument("--epochs", type=int, default=EPOCHS)',
            f'    parser.add_argument("--batch-size", type=int, default={bs})',
            f'    parser.add_argument("--lr", type=float, default={lr})',
            "    return parser.parse_args()",
            "",
            "",
        ]
    cfg_line = {
        "argparse": ["args = parse_args()"],
        "dataclass": ["cfg = Config()"],
        "constants": [],
    }[config]
    if structure == "toplevel":
        parts += cfg_line + setup + epoch_loop
    elif structure == "main":
        parts += ["def main():"] + ["    " + s for s in cfg_line + setup + epoch_loop]
        parts += ["", "", 'if __name__ == "__main__":', "    main()"]
    else:
        train_args = {"argparse": "args", "dataclass": "cfg", "constants": ""}[config]
        sig = ", ".join(
            filter(
                None,
                [train_args, m, o, loader, dev]
                + (["criterion"] if crit == "criterion" else [])
                + (["scheduler"] if sched else [])
                + (["scaler"] if amp == "fp16" else [])
                + (["val_loader"] if evaluate else []),
            )
        )
        parts += [f"def train({sig}):"] + ["    " + s for s in epoch_loop] + ["", ""]
        parts += (
            ["def main():"]
            + ["    " + s for s in cfg_line + setup]
            + [f"    train({sig})"]
        )
        parts += ["", "", 'if __name__ == "__main__":', "    main()"]
    return "\n".join(parts).replace("\n\n\n\n", "\n\n\n") + "\n"


def precommit_script(rng: random.Random, lines: int = 300) -> str:
    """A template script with every feature on, padded with helpers to about `lines` lines."""
    src = template_script(rng, 0, big=True)
    pool = list(HELPERS)
    rng.shuffle(pool)
    module = cst.parse_module(src)
    while src.count("\n") < lines - 12 and pool:
        helper = cst.parse_module(pool.pop()).body
        body = list(module.body)
        module = module.with_changes(body=body[:-2] + list(helper) + body[-2:])
        src = module.code
    extra = 0
    while src.count("\n") < lines:
        extra += 1
        body = list(module.body)
        filler = cst.parse_module(
            f'def log_{extra}(step, value):\n    if step % 100 == 0:\n        print(f"step {{step}}: {{value:.4f}}")\n    return value\n'
        ).body
        module = module.with_changes(body=body[:-2] + list(filler) + body[-2:])
        src = module.code
    return src


# ---------------------------------------------------------------- corpus


def base_sources() -> list[tuple[str, str]]:
    found = [(p.parent.name, p) for p in sorted((REPO / "fixtures").glob("*/input.py"))]
    found += [(p.stem, p) for p in sorted((REPO / "bench" / "gpu").glob("*_single.py"))]
    return [(name, p.read_text()) for name, p in found]


def generate(out: Path, count: int = 240, seed: int = 0) -> dict:
    """Write the corpus into out/corpus/ and out/precommit_300.py; return a summary."""
    rng = random.Random(seed)
    corpus = out / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    kinds: dict[str, int] = {}
    rejected = 0

    def emit(name: str, kind: str, text: str) -> None:
        nonlocal rejected
        try:
            compile(text, name, "exec")
        except SyntaxError:
            rejected += 1
            return
        path = corpus / f"{len(written):03d}_{name}.py"
        path.write_text(text)
        written.append(path)
        kinds[kind] = kinds.get(kind, 0) + 1

    for name, src in base_sources():
        variants = {
            "orig": lambda s: s,
            "renamed": rename,
            "reordered": reorder,
            "padded": lambda s: pad(s, rng),
            "combined": lambda s: pad(reorder(rename(s)), rng),
        }
        for kind, fn in variants.items():
            try:
                emit(f"{name}_{kind}", kind, fn(src))
            except cst.ParserSyntaxError:
                rejected += 1
    i = 0
    while len(written) < count:
        i += 1
        emit(f"template_{i:03d}", "template", template_script(rng, i))
    big = precommit_script(random.Random(seed + 1))
    compile(big, "precommit_300.py", "exec")
    (out / "precommit_300.py").write_text(big)
    lines = sum(p.read_text().count("\n") for p in written)
    return {
        "files": len(written),
        "lines": lines,
        "kinds": kinds,
        "rejected": rejected,
        "precommit_lines": big.count("\n"),
        "paths": [str(p) for p in written],
        "precommit": str(out / "precommit_300.py"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", type=Path)
    p.add_argument("--count", type=int, default=240)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    s = generate(a.out, a.count, a.seed)
    print(
        f"{s['files']} scripts, {s['lines']} lines in {a.out / 'corpus'} ({s['kinds']}); "
        f"{s['rejected']} rejected; precommit_300.py: {s['precommit_lines']} lines"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
