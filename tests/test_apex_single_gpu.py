"""Single-GPU scripts that use apex (issue 33): apex alone distributes nothing, so they get the
whole conversion under both targets; torch.amp keeps the script's own precision switch, the
optimizer's update rule and the import fallbacks' intent; every documented shape of scale_loss
converts. Fixtures 210-225 hold the whole scripts; this file checks the claims behind them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst
import pytest

from ddpify import Options, convert_source
from ddpify.analysis import Analysis

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SINGLE_GPU = sorted(
    d
    for d in FIXTURES.glob("2[12][0-9]_*")
    if (d / "expected_apex.py").exists() and "legacy" not in d.name
)
LEGACY = [
    FIXTURES / n
    for n in (
        "40_apex_classifier",
        "41_apex_segmentation_json",
        "42_apex_two_encoders_fusedadam",
        "77_legacy_apex_nccl",
        "225_legacy_syncbn_own_group",
    )
]


def _unwrapped(name: str) -> str:
    """A fixture's expected output with its statements unwrapped (line_length=0), for substring checks."""
    import json

    d = FIXTURES / name
    f = d / "options.json"
    opts = {**(json.loads(f.read_text()) if f.exists() else {}), "line_length": 0}
    return convert_source((d / "input.py").read_text(), Options(**opts)).source


def _analysis(src: str) -> Analysis:
    return Analysis(cst.parse_module(src), src)


def _codes(result) -> list[str]:
    return [f.code for f in result.findings]


# -- what distributes --------------------------------------------------------------------
APEX_ONLY = {
    "amp": "from apex import amp\nmodel, opt = amp.initialize(model, opt)\nwith amp.scale_loss(loss, opt) as s:\n    s.backward()\n",
    "fused-adam": "from apex.optimizers import FusedAdam\nopt = FusedAdam(model.parameters())\nloss.backward()\n",
    "syncbn": "import apex\nmodel = apex.parallel.convert_syncbn_model(model)\nloss.backward()\n",
    "local-rank-flag-unused": "import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, default=0)\nloss.backward()\n",
}
DISTRIBUTED = {
    "apex-ddp": "from apex.parallel import DistributedDataParallel as DDP\nmodel = DDP(model)\n",
    "process-group": "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
    "launcher-rank-for-device": "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int)\nargs = p.parse_args()\ntorch.cuda.set_device(args.local_rank)\n",
    "launcher-rank-one-name-away": "import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int)\nargs = p.parse_args()\nlocal_rank = args.local_rank\nmodel.cuda(local_rank)\n",
    "accelerate": "from accelerate import Accelerator\naccelerator = Accelerator()\n",
    "fabric": "from lightning.fabric import Fabric\nfabric = Fabric()\n",
    "deepspeed": "import deepspeed\nengine, opt, _, _ = deepspeed.initialize(model=model)\n",
    "horovod": "import horovod.torch as hvd\nhvd.init()\n",
}


@pytest.mark.parametrize("name", APEX_ONLY)
def test_apex_alone_marks_nothing_distributed(name):
    assert _analysis(APEX_ONLY[name]).distributed_api is None


@pytest.mark.parametrize("name", DISTRIBUTED)
def test_what_distributes_is_distributed(name):
    assert _analysis(DISTRIBUTED[name]).distributed_api is not None


# -- the whole conversion, both targets ----------------------------------------------------
@pytest.mark.parametrize("d", SINGLE_GPU, ids=lambda d: d.name)
@pytest.mark.parametrize("stem", ["expected", "expected_apex"])
def test_single_gpu_apex_script_is_distributed(d: Path, stem: str):
    out = (d / f"{stem}.py").read_text()
    for part in (
        "ddp_setup()",
        "DistributedSampler(",
        "RANK == 0",
        "destroy_process_group()",
        "set_epoch(",
    ):
        assert part in out, (d.name, stem, part)
    assert "ddp_in_place(" in out, (d.name, stem)
    assert "[blocking]" not in (d / f"{stem}.txt").read_text()


@pytest.mark.parametrize("d", SINGLE_GPU + LEGACY, ids=lambda d: d.name)
def test_torch_target_keeps_only_what_torch_lacks(d: Path):
    """With torch.amp, apex stays only for FusedLAMB (torch has no LAMB), and says so (DDP097)."""
    out = (d / "expected.py").read_text()
    kept = {
        q
        for line in out.splitlines()
        for q in re.findall(r"^\s*(?:from apex\S* import (\w+)|import apex)", line)
    }
    if "FusedLAMB" in (d / "input.py").read_text():
        assert kept == {"FusedLAMB"} and "DDP097" in (d / "expected.txt").read_text()
    else:
        assert not kept, (d.name, kept)
    code = "\n".join(ln.split("#")[0] for ln in out.splitlines())
    assert "amp.scale_loss(" not in code and "amp.initialize(" not in code


@pytest.mark.parametrize("d", SINGLE_GPU + LEGACY, ids=lambda d: d.name)
@pytest.mark.parametrize("stem", ["expected", "expected_apex"])
def test_outputs_are_valid_code_that_binds_no_library_attribute(d: Path, stem: str):
    if not (d / f"{stem}.py").exists():
        pytest.skip(f"{d.name} has no {stem}.py")
    src = (d / f"{stem}.py").read_text()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        for t in getattr(node, "targets", []) if isinstance(node, ast.Assign) else []:
            if isinstance(t, ast.Attribute):
                root = t
                while isinstance(root, ast.Attribute):
                    root = root.value
                assert not (
                    isinstance(root, ast.Name)
                    and root.id in ("torch", "apex", "nn", "F")
                ), ast.unparse(node)
        if isinstance(node, ast.Try):
            assert not all(isinstance(s, ast.Pass) for s in node.body), (
                f"{d.name}: a try that does nothing"
            )


def test_import_fallback_keeps_the_authors_intent():
    """The issue's example: the alias is bound in both branches; it stays bound, to the torch
    optimizer that keeps FusedAdam's update rule, and the availability flag is simply true."""
    src = _unwrapped("215_fusedadam_fallback_fp16_flag")
    assert "AdamImpl = torch.optim.AdamW\n" in src and "APEX_AVAILABLE = True\n" in src
    assert (
        "optimizer = AdamImpl(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, fused=True)"
        in src
    )
    assert "try:" not in src


def test_a_fallback_that_can_still_fail_is_kept():
    """A try that still imports something else keeps its handler; the apex name in it is bound to its replacement."""
    src = (
        "import torch\ntry:\n    import wandb\n    from apex.optimizers import FusedAdam\nexcept ImportError:\n"
        "    wandb = None\n    FusedAdam = torch.optim.Adam\n\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = FusedAdam(model.parameters(), lr=0.1)\nloss = model(torch.randn(4, 2)).sum()\nloss.backward()\nopt.step()\n"
    )
    out = convert_source(src, Options(ignore=("DDP024",), line_length=0)).source
    assert (
        "    import wandb\n    FusedAdam = torch.optim.AdamW\nexcept ImportError:\n    wandb = None\n    FusedAdam = torch.optim.Adam\n"
        in out
    )
    assert (
        "opt = FusedAdam(model.parameters(), lr=0.1, weight_decay=0.0, fused=True)"
        in out
    )
    compile(out, "out.py", "exec")


# -- FusedAdam's update rule -------------------------------------------------------------------
def _fused_adam_reference(
    params, grads, steps, lr, wd, adam_w_mode, betas=(0.9, 0.999), eps=1e-8
):
    """apex's FusedAdam kernel (csrc/multi_tensor_adam.cu): ADAM_MODE_0 adds wd*p to the gradient
    (L2), ADAM_MODE_1 adds wd*p to the update (decoupled, AdamW); bias correction on."""
    import torch

    out = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        for i, (p, g) in enumerate(zip(out, grads)):
            g = g + wd * p if not adam_w_mode else g
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[i] / (1 - betas[0] ** t), v[i] / (1 - betas[1] ** t)
            update = m_hat / (v_hat.sqrt() + eps) + (wd * p if adam_w_mode else 0)
            out[i] = p - lr * update
    return out


@pytest.mark.parametrize("mode", ["", ", adam_w_mode=True", ", adam_w_mode=False"])
@pytest.mark.parametrize("wd", ["", ", weight_decay=0.1"])
def test_fused_adam_replacement_keeps_the_update_rule(mode, wd):
    import torch

    src = f"import torch\nfrom apex.optimizers import FusedAdam\nopt = FusedAdam(params, lr=0.01{mode}{wd})\n"
    res = convert_source(
        src + "loss.backward()\nopt.step()\n",
        Options(ignore=("DDP024", "DDP034", "DDP099"), line_length=0),
    )
    line = next(ln for ln in res.source.splitlines() if ln.startswith("opt = "))
    said = next(f.message for f in res.findings if "FusedAdam ->" in f.message)
    expect = "torch.optim.Adam(" if "False" in mode else "torch.optim.AdamW("
    assert (
        expect in line and expect.rstrip("(") in said
    )  # the finding says which optimizer it became
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3, 2))]
    start = [p.detach().clone() for p in params]
    grads = [torch.randn_like(p) for p in params]
    ns = {"torch": torch, "params": params}
    exec(line, ns)
    for _ in range(3):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        ns["opt"].step()
    ref = _fused_adam_reference(
        start, grads, 3, 0.01, 0.1 if wd else 0.0, "False" not in mode
    )
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), r, rtol=1e-5, atol=1e-6)


def test_fused_lamb_is_kept_and_said():
    out = (FIXTURES / "217_fusedlamb_amp_no_fallback" / "expected.py").read_text()
    assert (
        "from apex.optimizers import FusedLAMB" in out
        and "from apex import amp" not in out
    )
    said = (FIXTURES / "217_fusedlamb_amp_no_fallback" / "expected.txt").read_text()
    assert (
        "DDP097 apex.optimizers.FusedLAMB kept (torch has no LAMB optimizer): it needs apex built with its CUDA extensions"
        in said
    )


# -- mixed precision only where the script had it ------------------------------------------
def _amp_helpers(src: str, monkeypatch, cuda: bool) -> dict:
    """The generated module-level amp settings of an output, run on their own."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    tree = ast.parse(src)
    keep = [
        n
        for n in tree.body
        if (
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") in ("AMP_DTYPE", "SCALER") for t in n.targets)
        )
        or (isinstance(n, ast.FunctionDef) and n.name == "amp_initialize")
    ]
    ns = {"torch": torch}
    exec(compile(ast.Module(keep, []), "helpers", "exec"), ns)
    return ns


@pytest.mark.parametrize(
    "name",
    [
        "215_fusedadam_fallback_fp16_flag",
        "220_fp16_switch_off_by_default",
        "223_fp16_off_in_config",
    ],
)
def test_a_default_off_switch_keeps_full_precision(name, monkeypatch):
    """On a GPU machine the output trains in fp16 only where the script's switch turns amp on."""
    import torch

    src = (FIXTURES / name / "expected.py").read_text()
    ns = _amp_helpers(src, monkeypatch, cuda=True)
    assert (
        ns["AMP_DTYPE"] is None
    )  # before amp_initialize: full precision, however the script starts
    call = next(ln for ln in src.splitlines() if "= amp_initialize(" in ln)
    guard = src.splitlines()[src.splitlines().index(call) - 1]
    assert re.match(r"\s*if .*(fp16|use_amp)", guard), (
        guard
    )  # behind the script's own switch
    ns["amp_initialize"]("model", "optimizer", opt_level="O1")
    assert ns["AMP_DTYPE"] == torch.float16
    ns["amp_initialize"]("model", "optimizer", opt_level="O0")
    assert ns["AMP_DTYPE"] is None
    assert (
        ns["amp_initialize"]("m", "o") == ("m", "o")
        and ns["amp_initialize"]("m") == "m"
    )


def test_an_amp_initialize_that_always_runs_is_fixed_settings(monkeypatch):
    import torch

    src = (FIXTURES / "210_apex_toplevel_o1" / "expected.py").read_text()
    assert "amp_initialize" not in src
    assert _amp_helpers(src, monkeypatch, cuda=True)["AMP_DTYPE"] == torch.float16
    assert _amp_helpers(src, monkeypatch, cuda=False)["AMP_DTYPE"] is None


def test_fp16_off_runs_no_scaled_step_on_cpu(forkrun, tmp_path):
    """220 as converted, its switch off: trains (the disabled scaler steps as the optimizer would)."""
    run = forkrun.run(
        FIXTURES / "220_fp16_switch_off_by_default" / "expected.py",
        ["--epochs", "1"],
        tmp_path,
    )
    assert run.returncode == 0 and "epoch 0 loss" in run.stdout, run.stderr[-3000:]


# -- every shape of scale_loss ---------------------------------------------------------------
SHAPES = {
    "step-a-few-lines-later": """\
for x, y in loader:
    loss = model(x).sub(y).pow(2).mean()
    opt.zero_grad()
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    total += loss.item()
    opt.step()
""",
    "if-else-plain-backward": """\
for x, y in loader:
    loss = model(x).sub(y).pow(2).mean()
    opt.zero_grad()
    if args.fp16:
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
    else:
        loss.backward()
    opt.step()
""",
    "helper-whose-caller-steps": """\
def backward(loss, optimizer):
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()


for x, y in loader:
    loss = model(x).sub(y).pow(2).mean()
    opt.zero_grad()
    backward(loss, opt)
    opt.step()
""",
    "accumulated-step": """\
for i, (x, y) in enumerate(loader):
    loss = model(x).sub(y).pow(2).mean() / 4
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
""",
}
HEAD = """\
import argparse
import torch
from apex import amp
from torch.utils.data import DataLoader, TensorDataset

args = argparse.ArgumentParser().parse_args()
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)
model = torch.nn.Linear(4, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = amp.initialize(model, opt, opt_level="O1")
total = 0.0
"""


@pytest.mark.parametrize("shape", SHAPES)
def test_every_scale_loss_shape_converts(shape):
    src = HEAD + SHAPES[shape]
    res = convert_source(src, Options(line_length=0))
    assert res.status == "converted" and "DDP096" not in _codes(res), res.findings
    out = res.source
    assert (
        "SCALER.scale(loss).backward()" in out
        and "SCALER.step(opt)" in out
        and "opt.step()" not in out
    )
    assert out.count("SCALER.update()") == 1 and "amp." not in out.replace(
        "torch.amp.", ""
    )
    # the update follows the step at its own level (inside the accumulation test where there is one)
    step_line = next(ln for ln in out.splitlines() if "SCALER.step(opt)" in ln)
    update_line = next(ln for ln in out.splitlines() if "SCALER.update()" in ln)
    assert len(step_line) - len(step_line.lstrip()) == len(update_line) - len(
        update_line.lstrip()
    )
    if "clip_grad_norm_" in src:
        assert out.index("SCALER.unscale_(opt)") < out.index("clip_grad_norm_")
    with_apex = convert_source(src, Options(amp="apex", line_length=0))
    assert "DDP096" not in _codes(with_apex) and with_apex.source.count(
        "amp.scale_loss("
    ) == src.count("amp.scale_loss(")


def test_several_losses_onto_fewer_optimizers():
    """apex's DCGAN shape: two D losses, one D step; one G loss, one G step; one update."""
    out = (FIXTURES / "222_dcgan_three_losses" / "expected.py").read_text()
    assert (
        out.count("SCALER.step(optimizerD)") == 1
        and out.count("SCALER.step(optimizerG)") == 1
    )
    assert out.count("SCALER.update()") == 1 and out.index(
        "SCALER.step(optimizerG)"
    ) < out.index("SCALER.update()")
    assert out.count("with torch.autocast(") == 3  # each loss's forward pass
    for loss in ("errD_real", "errD_fake", "errG"):
        assert f"SCALER.scale({loss}).backward()" in out


@pytest.mark.parametrize("name", ["214_apex_list_of_models", "222_dcgan_three_losses"])
@pytest.mark.parametrize("stem", ["expected", "expected_apex"])
def test_amp_initialize_over_a_list_wraps_each_model(name, stem):
    out = (FIXTURES / name / f"{stem}.py").read_text()
    src = (FIXTURES / name / "input.py").read_text()
    models = re.search(
        r"\[(\w+), (\w+)\], \[\w+, \w+\] = amp\.initialize", src
    ).groups()
    init = (
        out.find("amp.initialize(")
        if stem == "expected_apex"
        else out.find("= amp_initialize(")
    )
    # DDP in place before the optimizers take the parameters; it starts at the first
    # forward, after amp.initialize
    for m in models:
        wrap = out.index(f"ddp_in_place({m})")
        assert init < 0 or wrap < init, (m, stem)  # the torch target may drop it


# -- --amp apex: the script's own amp stays, the seeds' recipe around it ----------------------
@pytest.mark.parametrize(
    "d",
    [d for d in SINGLE_GPU if "amp.initialize" in (d / "input.py").read_text()],
    ids=lambda d: d.name,
)
def test_apex_target_keeps_the_scripts_amp(d: Path):
    src, out = (d / "input.py").read_text(), (d / "expected_apex.py").read_text()
    for part in (
        "amp.initialize(",
        "amp.scale_loss(",
        "amp.state_dict()",
        "amp.load_state_dict(",
    ):
        assert out.count(part) >= src.count(part), part
    assert "SCALER" not in out and "torch.autocast" not in out
    assert "ddp_in_place(" in out and "amp.initialize(" in out


def test_apex_target_saves_and_restores_the_amp_state():
    """An amp.initialize that always runs: amp's state joins the checkpoint the script saves."""
    src = (
        HEAD.replace("total = 0.0\n", "")
        + """\
for epoch in range(2):
    for x, y in loader:
        loss = model(x.cuda()).sub(y.cuda()).pow(2).mean()
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ck.pt")
"""
    )
    out = convert_source(src, Options(amp="apex", line_length=0)).source
    assert '"opt": opt.state_dict(), "amp": amp.state_dict()}' in out
    guarded = re.search(r"if RANK == 0:\n\s+torch\.save\(", out)
    assert guarded


# -- resume from an amp checkpoint -------------------------------------------------------------
def test_resume_from_the_amp_checkpoint(forkrun, tmp_path):
    script = FIXTURES / "211_apex_train_fn_o2_resume" / "expected.py"
    first = forkrun.run(script, ["--epochs", "1"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = forkrun.run(script, ["--epochs", "2", "--resume"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (
        "resumed at epoch 1" in again.stdout
        and "epoch 1 train loss" in again.stdout
        and "epoch 0 train" not in again.stdout
    )


# -- legacy outputs: the same last checks, the teardown --------------------------------------
@pytest.mark.parametrize("d", LEGACY, ids=lambda d: d.name)
def test_legacy_output_pauses_after_its_own_group(d: Path):
    out = _unwrapped(d.name).splitlines()
    inits = [i for i, ln in enumerate(out) if "init_process_group(" in ln]
    assert inits
    for i in inits:
        assert "atexit.register(time.sleep, 0.2)" in out[i + 3], out[i : i + 4]
    assert any("destroy_process_group()" in ln for ln in out)


def test_legacy_path_gets_the_undefined_name_check():
    """The legacy planners' output goes through the same last check (DDP005) as every other:
    an apex name the rewrite does not reach (amp.__version__) would be read after its import is
    gone, and that is said, not written."""
    src = (
        (FIXTURES / "40_apex_classifier" / "input.py")
        .read_text()
        .replace(
            "    torch.manual_seed(0)\n",
            "    torch.manual_seed(0)\n    print(amp.__version__)\n",
        )
    )
    res = convert_source(src, Options(line_length=0))
    assert res.status == "refused" and _codes(res) == ["DDP005"], res.findings


def test_syncbn_only_on_cuda():
    out = _unwrapped("225_legacy_syncbn_own_group")
    assert (
        "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) if torch.cuda.is_available() else model"
        in out
    )


def test_switch_in_one_file_steps_in_another_is_refused(tmp_path):
    """Project mode copies the generated settings into each file: amp_initialize() flipped in the
    entry would not reach the trainer module's scaled steps. Said, not converted; --amp apex keeps
    apex's own (process-wide) state and converts."""
    from ddpify.project import convert_project

    (tmp_path / "trainer.py").write_text(
        "from apex import amp\n\n\ndef train_epoch(model, loader, optimizer):\n    for x, y in loader:\n"
        "        loss = ((model(x.cuda()) - y.cuda()) ** 2).mean()\n        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled:\n            scaled.backward()\n        optimizer.step()\n"
        "    return loss.item()\n"
    )
    (tmp_path / "train.py").write_text(
        "import argparse\n\nimport torch\nfrom apex import amp\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "from trainer import train_epoch\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--fp16', action='store_true')\n    args = parser.parse_args()\n    torch.manual_seed(0)\n"
        "    model = torch.nn.Linear(4, 1).cuda()\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    if args.fp16:\n        model, optimizer = amp.initialize(model, optimizer)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)\n"
        "    for epoch in range(2):\n        print(f'epoch {epoch} loss {train_epoch(model, loader, optimizer):.4f}')\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    res = convert_project(str(tmp_path / "train.py"))
    assert res.status == "refused"
    assert [f.code for r in res.files for f in r.findings] == ["DDP096"]
    assert (
        convert_project(
            str(tmp_path / "train.py"), Options(amp="apex", line_length=0)
        ).status
        == "converted"
    )
