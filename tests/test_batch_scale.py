"""--keep-global-batch and --scale-lr linear (ddpify/transforms/batch_scale.py): where the batch size
and the learning rate are rewritten, where they cannot be (DDP014, DDP016), the DDP026 note, the
options from the command line, [tool.ddpify] and verify; and, as 2 gloo ranks on the CPU, that
each rank takes half the batch (together the original one) or twice the learning rate."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import free_port

from ddpify import Options, convert_source
from ddpify.cli import convert_command
from ddpify.config import ConfigError, _parse_table, find_config
from ddpify.transforms.batch_scale import DEFAULT_NOTE, decide, times_world_size

KEEP = Options(keep_global_batch=True)
SCALE = Options(scale_lr="linear")

HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
DATA = "torch.manual_seed(0)\nds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\nmodel = nn.Linear(4, 1)\n"
LOOP = """for epoch in range(2):
    for x, y in train_loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
"""
OPT = "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
TWO_PARTS = "model = nn.Sequential()\nmodel.body = nn.Linear(4, 4)\nmodel.head = nn.Linear(4, 1)"


def script(
    loader: str = "train_loader = DataLoader(ds, batch_size=32, shuffle=True)\n",
    opt: str = OPT,
    pre: str = "",
) -> str:
    return HEAD + pre + DATA + loader + opt + LOOP


def found(res, code: str) -> list[str]:
    return [f.message for f in res.findings if f.code == code]


# --------------------------------------------------------------------------- --keep-global-batch


@pytest.mark.parametrize(
    "expr, pre",
    [
        ("32", ""),
        ("BATCH", "BATCH = 32\n"),
        (
            "args.batch_size",
            "import argparse\nargs = argparse.Namespace(batch_size=32)\n",
        ),
        ('cfg["train"]["batch_size"]', 'cfg = {"train": {"batch_size": 32}}\n'),
        ("2 * half", "half = 16\n"),
    ],
)
def test_the_batch_size_expression_the_loader_gets_is_divided(expr, pre):
    res = convert_source(
        script(
            f"train_loader = DataLoader(ds, batch_size={expr}, shuffle=True)\n", pre=pre
        ),
        KEEP,
    )
    assert f"batch_size=ddp_local_batch({expr})" in res.source
    assert res.source.count("def ddp_local_batch(batch_size):") == 1
    assert found(res, "DDP026")[0].startswith(
        "--keep-global-batch: batch_size is divided by WORLD_SIZE"
    )
    assert not found(res, "DDP014")


def test_a_positional_batch_size_and_an_eval_loader():
    loaders = (
        "train_loader = DataLoader(ds, 16, shuffle=True)\n"
        "val_loader = DataLoader(ds, batch_size=64)\n"
    )
    res = convert_source(script(loaders), KEEP)
    assert "ddp_local_batch(16)" in res.source
    assert (
        "DataLoader(ds, batch_size=64)" in res.source
    )  # evaluation: every rank evaluates the whole set, unchanged


def test_the_default_is_unchanged():
    src = script()
    plain = convert_source(src)
    assert "ddp_local_batch" not in plain.source and "* WORLD_SIZE" not in plain.source
    assert found(plain, "DDP026") == [DEFAULT_NOTE]
    assert convert_source(src, Options(keep_global_batch=False)).source == plain.source


def test_the_decision_is_a_plan_read_from_the_analysis():
    import libcst as cst

    from ddpify.analysis import Analysis, code

    src = script(opt="opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n")
    a = Analysis(cst.parse_module(src), src)
    kept = decide(a, KEEP)
    assert (
        [code(d.value) for d in kept.divide] == ["32"]
        and not kept.scale
        and not kept.left
    )
    scaled = decide(a, SCALE)
    assert (
        not scaled.divide
        and [code(v) for s in scaled.scale for v in s.values] == ["1e-3"]
        and scaled.every_lr_scaled
    )
    assert decide(a, Options()) == type(kept)()


def test_a_read_of_the_batch_size_in_the_training_loop_is_pointed_out():
    loop = LOOP.replace(
        "        opt.step()\n", "        opt.step()\n        seen = BATCH * epoch\n"
    )
    res = convert_source(
        HEAD
        + "BATCH = 32\n"
        + DATA
        + "train_loader = DataLoader(ds, batch_size=BATCH, shuffle=True)\n"
        + OPT
        + loop,
        KEEP,
    )
    assert "`BATCH` read in the training loop (line" in found(res, "DDP026")[0]


@pytest.mark.parametrize(
    "loader, why",
    [
        ("train_loader = DataLoader(ds, shuffle=True)\n", "has no batch_size"),
        (
            "kw = {'batch_size': 8, 'shuffle': True}\ntrain_loader = DataLoader(ds, **kw)\n",
            "may come from **kw",
        ),
        ("train_loader = DataLoader(ds, batch_size=None)\n", "batch_size=None"),
    ],
)
def test_a_batch_size_the_call_does_not_show_is_said(loader, why):
    res = convert_source(script(loader), KEEP)
    assert "ddp_local_batch" not in res.source
    assert any(why in msg for msg in found(res, "DDP014")), res.findings
    assert all(f.severity == "note" for f in res.findings if f.code == "DDP014")


def test_a_batch_sampler_is_said():
    loader = (
        "from torch.utils.data import BatchSampler, SequentialSampler\n"
        "train_loader = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 8, False))\n"
    )
    res = convert_source(script(loader), Options(keep_global_batch=True, partial=True))
    assert any("batch_sampler" in msg for msg in found(res, "DDP014"))


def test_batches_without_a_loader_are_said():
    body = (
        "X, Y = torch.randn(64, 4), torch.randn(64, 1)\nmodel = nn.Linear(4, 1)\n"
        + OPT
        + "for epoch in range(2):\n    for i in range(0, 64, 16):\n        loss = nn.functional.mse_loss(model(X[i:i + 16]), Y[i:i + 16])\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    )
    res = convert_source(
        "import torch\nimport torch.nn as nn\n\ntorch.manual_seed(0)\n" + body, KEEP
    )
    assert "rank_share(" in res.source and "ddp_local_batch" not in res.source
    assert "slices of pre-loaded tensors" in found(res, "DDP014")[0]
    assert found(res, "DDP026")[0].endswith(
        "--keep-global-batch could not divide it here (DDP014)"
    )


def test_a_script_of_its_own_ddp_local_batch_keeps_it():
    src = script(pre="def ddp_local_batch(n):\n    return n\n\n\n")
    res = convert_source(src, KEEP)
    assert (
        "def ddp_local_batch(n):" in res.source
        and "def ddpify_ddp_local_batch(batch_size):" in res.source
    )
    assert "batch_size=ddpify_ddp_local_batch(32)" in res.source


# --------------------------------------------------------------------------- --scale-lr linear


def test_lr_and_param_groups_are_scaled_once():
    opt = (
        'groups = [{"params": model.body.parameters(), "lr": 0.01}, dict(params=model.head.parameters(), momentum=0.5)]\n'
        "opt = torch.optim.SGD(groups, lr=base + 0.05, momentum=0.9)\n"
    )
    res = convert_source(
        script(opt=opt, pre="base = 0.05\n").replace(
            "model = nn.Linear(4, 1)", TWO_PARTS
        ),
        SCALE,
    )
    assert '"lr": 0.01 * WORLD_SIZE' in res.source
    assert "lr=(base + 0.05) * WORLD_SIZE" in res.source
    assert res.source.count("* WORLD_SIZE") == 2
    assert found(res, "DDP015") == [
        '--scale-lr linear: lr and 1 param group\'s "lr" multiplied by WORLD_SIZE, the linear scaling rule for the global batch of batch_size x WORLD_SIZE'
    ]
    assert found(res, "DDP026")[0].endswith(
        "multiplies the learning rate by WORLD_SIZE to match (the linear scaling rule)"
    )
    assert "ddp_local_batch" not in res.source


def test_a_positional_lr_and_a_helper_that_builds_the_optimizer():
    opt = "def make_opt(params, rate):\n    return torch.optim.Adam(params, rate)\n\n\nopt = make_opt(model.parameters(), 1e-3)\n"
    res = convert_source(script(opt=opt), SCALE)
    assert "torch.optim.Adam(params, rate * WORLD_SIZE)" in res.source
    assert (
        "make_opt(model.parameters(), 1e-3)" in res.source
    )  # scaled where it is built, not again at the call
    assert len(found(res, "DDP015")) == 1 and not found(res, "DDP016")


def test_a_table_of_optimizer_lambdas_is_scaled_at_its_call_only():
    opt = (
        'OPTIMIZERS = {"adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr, weight_decay=0.01)}\n'
        'opt = OPTIMIZERS["adamw"](model.parameters(), lr=0.01)\n'
    )
    res = convert_source(script(opt=opt), SCALE)
    assert "torch.optim.AdamW(params, lr=lr, weight_decay=0.01)" in res.source
    assert 'OPTIMIZERS["adamw"](model.parameters(), lr=0.01 * WORLD_SIZE)' in res.source
    assert len(found(res, "DDP015")) == 1


@pytest.mark.parametrize(
    "opt, why",
    [
        ("opt = torch.optim.Adam(model.parameters())\n", "gets no lr= here"),
        (
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nsched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=4)\n",
            "OneCycleLR sets the learning rate from its own max_lr",
        ),
        (
            'opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor g in opt.param_groups:\n    g["lr"] = 0.05\n',
            "sets a learning rate itself here",
        ),
    ],
)
def test_a_rate_set_elsewhere_is_said(opt, why):
    res = convert_source(script(opt=opt), SCALE)
    assert any(why in msg for msg in found(res, "DDP016")), res.findings
    assert found(res, "DDP026")[0].endswith(
        "could not scale every learning rate (DDP016)"
    )


def test_parameters_updated_by_hand_are_said():
    src = (
        HEAD
        + DATA
        + "train_loader = DataLoader(ds, batch_size=8, shuffle=True)\nlr = 0.1\n"
        + LOOP.replace(
            "        opt.zero_grad()\n", "        model.zero_grad()\n"
        ).replace(
            "        opt.step()\n",
            "        with torch.no_grad():\n            for p in model.parameters():\n                p -= lr * p.grad\n",
        )
    )
    res = convert_source(src, SCALE)
    assert "no optimizer is built here" in found(res, "DDP016")[0]
    assert (
        "lr = 0.1\n" in res.source and "p -= lr * p.grad" in res.source
    )  # nothing rewritten by guess


def test_times_world_size_keeps_precedence():
    import libcst as cst

    def show(text):
        return cst.Module([]).code_for_node(
            times_world_size(cst.parse_expression(text))
        )

    assert show("0.1") == "0.1 * WORLD_SIZE"
    assert show("args.lr / 10") == "args.lr / 10 * WORLD_SIZE"
    assert show("a + b") == "(a + b) * WORLD_SIZE"
    assert show("a if b else c") == "(a if b else c) * WORLD_SIZE"


def test_the_output_is_a_fixed_point():
    for opts in (KEEP, SCALE):
        out = convert_source(script(), opts).source
        again = convert_source(out, opts)
        assert not again.changed and again.status == "already-distributed"


# --------------------------------------------------------------------------- options and configuration


def test_the_two_options_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        Options(keep_global_batch=True, scale_lr="linear")
    with pytest.raises(ValueError, match="scale_lr must be one of linear"):
        Options(scale_lr="sqrt")
    res = CliRunner().invoke(
        convert_command,
        ["--keep-global-batch", "--scale-lr", "linear", "-"],
        input=script(),
    )
    assert res.exit_code == 2 and "exclude each other" in res.output
    res = CliRunner().invoke(
        convert_command, ["--scale-lr", "sqrt", "-"], input=script()
    )
    assert res.exit_code == 2 and "Invalid value for '--scale-lr'" in res.output


def test_configuration_keys():
    assert _parse_table("p", {"keep-global-batch": True}).values == {
        "keep_global_batch": True
    }
    assert _parse_table("p", {"scale_lr": "linear"}).values == {"scale_lr": "linear"}
    for bad, message in (
        ({"keep-global-batch": "yes"}, "must be true or false"),
        ({"scale-lr": "sqrt"}, "scale-lr must be one of linear"),
        ({"keep-global-batch": True, "scale-lr": "linear"}, "exclude each other"),
    ):
        with pytest.raises(ConfigError, match=message):
            _parse_table("p", bad)
    # the command line wins: the one it names replaces the configuration's other
    cfg = _parse_table("p", {"scale-lr": "linear"})
    assert cfg.options(keep_global_batch=True, scale_lr=None) == Options(
        keep_global_batch=True
    )
    assert cfg.options(keep_global_batch=None, scale_lr=None) == Options(
        scale_lr="linear"
    )
    assert _parse_table("p", {"keep-global-batch": True}).options(
        keep_global_batch=None, scale_lr="linear"
    ) == Options(scale_lr="linear")


def test_the_cli_and_pyproject(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text(script())
    res = CliRunner().invoke(
        convert_command, ["--diff", "--keep-global-batch", "train.py"]
    )
    assert "batch_size=ddp_local_batch(32)" in res.output
    Path("pyproject.toml").write_text('[tool.ddpify]\nscale-lr = "linear"\n')
    res = CliRunner().invoke(convert_command, ["--diff", "train.py"])
    assert (
        "+opt = torch.optim.SGD(model.parameters(), lr=0.1 * WORLD_SIZE)" in res.output
    )
    res = CliRunner().invoke(
        convert_command, ["--diff", "--keep-global-batch", "train.py"]
    )
    assert (
        "ddp_local_batch(32)" in res.output and "lr=0.1 * WORLD_SIZE" not in res.output
    )


def test_verify_passes_the_options_to_its_conversion(tmp_path, monkeypatch):
    import ddpify.verify.cli as verify_cli

    seen = []

    class Outcome:
        exit_code = 0

    monkeypatch.setattr(
        verify_cli,
        "run_verify",
        lambda *a, **kw: seen.append(kw["options"]) or Outcome(),
    )
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text(script())
    CliRunner().invoke(verify_cli.verify_command, ["train.py", "--keep-global-batch"])
    CliRunner().invoke(verify_cli.verify_command, ["train.py", "--scale-lr", "linear"])
    Path("pyproject.toml").write_text("[tool.ddpify]\nkeep-global-batch = true\n")
    find_config.cache_clear()
    CliRunner().invoke(verify_cli.verify_command, ["train.py"])
    CliRunner().invoke(
        verify_cli.verify_command, ["train.py", "--no-keep-global-batch"]
    )
    assert [(o.keep_global_batch, o.scale_lr) for o in seen] == [
        (True, None),
        (False, "linear"),
        (True, None),
        (False, None),
    ]


# --------------------------------------------------------------------------- as 2 gloo ranks

# Each rank says on stderr (every rank keeps it) how many samples its first batch holds and
# the learning rates its optimizer steps with.
PROBE = """import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
ds = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
train_loader = DataLoader(ds, batch_size=BATCH, shuffle=True)
model = nn.Linear(4, 2)
head = nn.Linear(2, 1)
opt = torch.optim.SGD([{"params": model.parameters()}, {"params": head.parameters(), "lr": 0.01}], lr=0.1)
for epoch in range(2):
    for step, (x, y) in enumerate(train_loader):
        loss = nn.functional.mse_loss(head(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if epoch == 0 and step == 0:
            lrs = [g["lr"] for g in opt.param_groups]
            print(f"probe batch {len(x)} lrs {lrs}", file=sys.stderr)
    print(f"epoch {epoch} loss {loss.item():.4f}")
"""


def _ranks(forkrun, tmp_path: Path, options: Options, batch: int, nproc: int = 2):
    out = convert_source(PROBE.replace("BATCH", str(batch)), options)
    assert out.changed, out.findings
    path = tmp_path / "train.py"
    path.write_text(out.source)
    env = (
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        if nproc > 1
        else {}
    )
    run = forkrun.run(path, [], tmp_path, nproc=nproc, env=env)
    assert not run.timed_out and run.returncode == 0, run.stderr[-3000:]
    probes = []
    for r in run.ranks:
        line = next(ln for ln in r.stderr.splitlines() if ln.startswith("probe batch"))
        words = line.split(" ", 4)
        probes.append((int(words[2]), eval(words[4])))
    return run, probes


@pytest.mark.runs
def test_keep_global_batch_halves_each_rank_batch(forkrun, tmp_path):
    pytest.importorskip("torch")
    run, probes = _ranks(forkrun, tmp_path, KEEP, 32)
    assert [b for b, _ in probes] == [16, 16]
    assert sum(b for b, _ in probes) == 32  # the global batch is the single-process one
    assert all(lrs == [0.1, 0.01] for _, lrs in probes)
    assert "epoch 1 loss" in run.ranks[0].stdout
    assert "not a multiple" not in run.stderr


@pytest.mark.runs
def test_a_batch_that_does_not_divide_is_said_on_rank0_only(forkrun, tmp_path):
    pytest.importorskip("torch")
    run, probes = _ranks(forkrun, tmp_path, KEEP, 5)
    assert [b for b, _ in probes] == [2, 2]
    rank0, rank1 = run.ranks
    assert (
        "ddpify: batch_size 5 is not a multiple of WORLD_SIZE 2: each rank takes 2, a global batch of 4 instead of 5"
        in rank0.stderr
    )
    assert "not a multiple" not in rank1.stderr


@pytest.mark.runs
def test_scale_lr_doubles_the_learning_rates_at_world_size_2(forkrun, tmp_path):
    pytest.importorskip("torch")
    _run, probes = _ranks(forkrun, tmp_path, SCALE, 32)
    assert [b for b, _ in probes] == [32, 32]  # the batch stays per process
    assert all(lrs == [0.2, 0.02] for _, lrs in probes)


@pytest.mark.runs
def test_a_plain_run_keeps_the_single_process_batch_and_rate(forkrun, tmp_path):
    pytest.importorskip("torch")
    for options in (KEEP, SCALE):
        _run, probes = _ranks(forkrun, tmp_path, options, 32, nproc=1)
        assert probes == [(32, [0.1, 0.01])]
