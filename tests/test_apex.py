"""The apex side (issues 4, 33): --amp apex emits the classic apex recipe; legacy apex /
torch.distributed.launch scripts are modernised to torch-native by default, or keep apex
with --amp apex and only get their launch fixed."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

from ddpify import Options, convert_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LEGACY = sorted(
    p for p in FIXTURES.glob("4[0-9]_*") if (p / "expected_apex.py").exists()
)
SINGLE = [FIXTURES / "43_single_gpu_for_apex"]
# every fixture with an --amp apex output beside its default one (legacy and single-GPU apex scripts)
APEX_TWIN = sorted(p for p in FIXTURES.iterdir() if (p / "expected_apex.py").exists())
DISTRIBUTED_LEGACY = [*LEGACY, FIXTURES / "225_legacy_syncbn_own_group"]
# arguments that keep a CPU run short; 41 reads its JSON config from the working directory
RUN_ARGS = {
    "40_apex_classifier": ["--epochs", "2"],
    "41_apex_segmentation_json": [],
    "42_apex_two_encoders_fusedadam": ["--epochs", "2"],
}
SEG_CONFIG = {"epochs": 3, "save_every": 2, "batch_size": 8}
LOSS = re.compile(r"loss\w*\W{0,3}?\s*:?\s*([-+]?\d+\.\d+)", re.I)


def _options(d: Path) -> Options:
    f = d / "options.json"
    return Options(**json.loads(f.read_text())) if f.exists() else Options()


def _findings(result) -> str:
    return "".join(f.format("input.py") + "\n" for f in result.findings)


def test_fixture_set():
    assert [p.name for p in LEGACY] == [
        "40_apex_classifier",
        "41_apex_segmentation_json",
        "42_apex_two_encoders_fusedadam",
    ]
    for d in LEGACY:
        src = (d / "input.py").read_text()
        assert "apex" in src and ("--local_rank" in src) and "--local-rank" not in src


# -- expected outputs -------------------------------------------------------------------
@pytest.mark.parametrize("d", APEX_TWIN, ids=lambda p: p.name)
@pytest.mark.parametrize(
    "stem,options",
    [("expected", Options()), ("expected_apex", Options(amp="apex"))],
    ids=["torch", "apex"],
)
def test_expected_under_both_targets(d: Path, stem: str, options: Options):
    result = convert_source((d / "input.py").read_text(), options, path="input.py")
    assert result.status == "converted"
    assert result.source == (d / f"{stem}.py").read_text()
    assert _findings(result) == (d / f"{stem}.txt").read_text()


@pytest.mark.parametrize("d", SINGLE, ids=lambda p: p.name)
def test_single_gpu_apex_expected(d: Path):
    options = _options(d)
    assert options.amp == "apex"
    result = convert_source((d / "input.py").read_text(), options, path="input.py")
    assert result.source == (d / "expected.py").read_text()
    assert _findings(result) == (d / "expected.txt").read_text()


def _outputs():
    for d in APEX_TWIN:
        yield d / "expected.py", Options()
        yield d / "expected_apex.py", Options(amp="apex")
    for d in SINGLE:
        yield d / "expected.py", _options(d)


@pytest.mark.parametrize(
    "path,options",
    list(_outputs()),
    ids=lambda x: f"{x.parent.name}/{x.name}" if isinstance(x, Path) else x.amp,
)
def test_idempotent(path: Path, options: Options):
    src = path.read_text()
    again = convert_source(src, options, path=path.name)
    assert not again.changed and again.source == src


@pytest.mark.runs
@pytest.mark.parametrize(
    "path,options",
    [o for o in _outputs() if o[1].amp == "apex"],
    ids=lambda x: f"{x.parent.name}/{x.name}" if isinstance(x, Path) else x.amp,
)
def test_apex_outputs_compile_and_keep_apex(path: Path, options: Options):
    src = path.read_text()
    compile(src, str(path), "exec")
    assert "apex" in src
    # a script that had the legacy launcher's flag accepts both spellings (torch>=2.0's launcher
    # passes --local-rank); a fresh conversion adds no flag: torchrun sets LOCAL_RANK
    had = "--local_rank" in (path.parent / "input.py").read_text()
    flat = re.sub(r"\s+", " ", src)
    assert ('"--local-rank", "--local_rank"' in flat) == had or (
        "--local-rank" not in src and not had
    )
    assert "LOCAL_RANK" in src


# -- --amp apex on a single-GPU script: the classic recipe, in order ---------------------
def test_single_gpu_apex_recipe_order():
    src = (SINGLE[0] / "expected.py").read_text()
    lines = src.splitlines()

    def at(pattern: str) -> int:
        hits = [i for i, ln in enumerate(lines) if re.search(pattern, ln)]
        assert len(hits) == 1, (pattern, hits)
        return hits[0]

    placed = at(r"model = SmallNet\(\)\.to\(device\)")
    wrap = at(r"^\s*ddp_in_place\(model\)")
    opt = at(r"optimizer = torch\.optim\.SGD")
    init = at(r'model, optimizer = amp\.initialize\(model, optimizer, opt_level="O1"\)')
    restore = at(r'amp\.load_state_dict\(ckpt\["amp"\]\)')
    # DDP applied in place starts at the first forward: after amp.initialize, as apex asks
    assert placed < wrap < opt < init < restore
    assert re.search(r'"amp": amp\.state_dict\(\)', src)
    assert re.search(
        r"with amp\.scale_loss\(loss, optimizer\) as scaled_loss:\n\s+scaled_loss\.backward\(\)",
        src,
    )
    assert (
        "DistributedDataParallel as DDP" not in src
    )  # torch's DDP is not used beside apex's


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_opt_level_option(level: str):
    src = (SINGLE[0] / "input.py").read_text()
    out = convert_source(src, Options(amp="apex", opt_level=level)).source
    assert f'amp.initialize(model, optimizer, opt_level="{level}")' in out


@pytest.mark.runs
def test_apex_output_fails_early_without_apex(tmp_path: Path):
    """apex is not installed here: the generated script stops at start-up naming the version."""
    assert (
        subprocess.run(
            [sys.executable, "-c", "import apex.amp"], capture_output=True
        ).returncode
        != 0
    )
    proc = subprocess.run(
        [sys.executable, str(SINGLE[0] / "expected.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert proc.returncode == 1
    assert "apex <= 25.04" in proc.stderr and "Traceback" not in proc.stderr


def test_two_models_one_initialize():
    """apex allows one amp.initialize: every model and optimizer go through the same call, one loss id each."""
    src = """\
import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    netG = nn.Linear(4, 4).cuda()
    netD = nn.Linear(4, 1).cuda()
    optG = torch.optim.Adam(netG.parameters())
    optD = torch.optim.Adam(netD.parameters())
    for step in range(3):
        x = torch.randn(8, 4).cuda()
        lossD = netD(netG(x).detach()).mean()
        optD.zero_grad()
        lossD.backward()
        optD.step()
        lossG = -netD(netG(x)).mean()
        optG.zero_grad()
        lossG.backward()
        optG.step()


if __name__ == "__main__":
    main()
"""
    # no DataLoader here (DDP024 would refuse): this test is about amp.initialize only
    out = convert_source(
        src, Options(amp="apex", ignore=("DDP024",), line_length=0)
    ).source  # unwrapped
    assert out.count("amp.initialize(") == 1
    assert (
        '[netG, netD], [optG, optD] = amp.initialize([netG, netD], [optG, optD], opt_level="O1", num_losses=2)'
        in out
    )
    assert "with amp.scale_loss(lossD, optD, loss_id=0) as scaled_loss:" in out
    assert "with amp.scale_loss(lossG, optG, loss_id=1) as scaled_loss:" in out
    assert (
        out.index("ddp_in_place(netG)")
        < out.index("amp.initialize(")
        < out.index("for step in range(3)")
    )
    compile(out, "gan.py", "exec")


# -- modernised legacy scripts run without apex ------------------------------------------
def _run(cmd: list[str], cwd: Path) -> str:
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
    )
    for k in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def _prepare(d: Path, tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    shutil.copy(d / "expected.py", script)
    (tmp_path / "seg.json").write_text(json.dumps(SEG_CONFIG))
    return script


def _forked(forkrun, script: Path, args: list[str], cwd: Path, nproc: int = 1) -> str:
    env = (
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        if nproc > 1
        else {}
    )
    run = forkrun.run(script, args, cwd, nproc=nproc, env=env)
    assert run.returncode == 0 and not run.timed_out, (
        f"{script} {args}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    )
    return run.stdout + run.stderr


@pytest.mark.runs
@pytest.mark.parametrize("d", LEGACY, ids=lambda p: p.name)
def test_modernised_runs_plain_python(d: Path, tmp_path: Path, forkrun):
    src = (d / "expected.py").read_text()
    assert not re.search(r"^\s*(import apex|from apex)", src, re.M)
    script = _prepare(d, tmp_path)
    out = _forked(forkrun, script, RUN_ARGS[d.name], tmp_path)
    losses = [float(x) for x in LOSS.findall(out)]
    assert len(losses) >= 2 and all(v == v for v in losses), out


@pytest.mark.runs
@pytest.mark.parametrize("d", LEGACY, ids=lambda p: p.name)
def test_modernised_runs_on_two_ranks(d: Path, tmp_path: Path, forkrun):
    script = _prepare(d, tmp_path)
    out = _forked(forkrun, script, RUN_ARGS[d.name], tmp_path, nproc=2)
    losses = [float(x) for x in LOSS.findall(out)]
    assert len(losses) >= 2, out
    # the old launcher's spelling is accepted too
    out = _forked(forkrun, script, ["--local-rank=0", *RUN_ARGS[d.name]], tmp_path)
    assert LOSS.search(out)


@pytest.mark.runs
@pytest.mark.parametrize(
    "d,args",
    [(LEGACY[0], RUN_ARGS[LEGACY[0].name]), (DISTRIBUTED_LEGACY[-1], ["--sync-bn"])],
    ids=lambda x: x.name if isinstance(x, Path) else "",
)
def test_modernised_runs_under_torchrun(d: Path, args: list[str], tmp_path: Path):
    """The real torchrun, 2 gloo ranks on CPU: 225 converts apex's SyncBatchNorm (GPUs only: the
    CPU run keeps BatchNorm) and keeps its own process group (the teardown pause: no abort)."""
    script = _prepare(d, tmp_path)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
    ]
    out = _run([*torchrun, str(script), *args], tmp_path)
    assert len(LOSS.findall(out)) >= 2, out
    assert "terminate called" not in out and "SyncBatchNorm" not in out, out


def _helper(src: str, name: str):
    """Compile one module-level helper of a generated script, with its globals."""
    import torch

    tree = ast.parse(src)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = {"torch": torch}
    exec(compile(ast.Module([fn], []), name, "exec"), ns)
    return ns


@pytest.mark.runs
def test_old_apex_amp_state_loads_into_gradscaler():
    import torch

    src = (FIXTURES / "42_apex_two_encoders_fusedadam" / "expected.py").read_text()
    ns = _helper(src, "scaler_state")
    ns["SCALER"] = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    state = ns["scaler_state"]({"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}})
    ns["SCALER"].load_state_dict(state)
    assert ns["SCALER"].get_scale() == 1024.0
    assert ns["SCALER"]._get_growth_tracker() == 7
    # a checkpoint written by the modernised script round-trips unchanged
    assert ns["scaler_state"](ns["SCALER"].state_dict())["scale"] == 1024.0


@pytest.mark.runs
def test_old_fused_adam_state_loads_into_adamw():
    import torch

    src = (FIXTURES / "42_apex_two_encoders_fusedadam" / "expected.py").read_text()
    load = _helper(src, "load_fused_adam_state")["load_fused_adam_state"]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))]
    # what apex's FusedAdam saved: one step per group, its own group keys, no torch flags
    old = {
        "state": {
            0: {"exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)},
            1: {"exp_avg": torch.ones(2), "exp_avg_sq": torch.ones(2)},
        },
        "param_groups": [
            {
                "lr": 1e-3,
                "bias_correction": True,
                "betas": (0.9, 0.99),
                "eps": 1e-8,
                "weight_decay": 0.0,
                "step": 5,
                "params": [0, 1],
            }
        ],
    }
    opt = torch.optim.AdamW(
        params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, fused=True
    )
    load(opt, old)
    group = opt.param_groups[0]
    assert group["fused"] and group.get("decoupled_weight_decay", True)
    assert float(opt.state[params[0]]["step"]) == 5.0
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert float(opt.state[params[0]]["step"]) == 6.0


@pytest.mark.runs
def test_legacy_resume_from_apex_checkpoint(tmp_path: Path, forkrun):
    """42's modernised script resumes from a checkpoint in apex's format."""
    import torch

    d = FIXTURES / "42_apex_two_encoders_fusedadam"
    script = _prepare(d, tmp_path)
    _forked(forkrun, script, ["--epochs", "1"], tmp_path)
    ck = torch.load(tmp_path / "clip_last.pt")
    for group in ck["optimizer"]["param_groups"]:
        group["step"] = 4
        group["bias_correction"] = True
        for k in (
            "amsgrad",
            "maximize",
            "foreach",
            "capturable",
            "differentiable",
            "fused",
            "decoupled_weight_decay",
        ):
            group.pop(k, None)
    for st in ck["optimizer"]["state"].values():
        st.pop("step")
    ck["amp"] = {"loss_scaler0": {"loss_scale": 512.0, "unskipped": 3}}
    torch.save(ck, tmp_path / "apex_ckpt.pt")
    out = _forked(
        forkrun, script, ["--epochs", "2", "--resume", "apex_ckpt.pt"], tmp_path
    )
    assert "epoch 1 loss" in out and "epoch 0 loss" not in out


def test_legacy_with_apex_target_only_fixes_launch_and_teardown():
    """--amp apex keeps a legacy script's apex: only its rank flag and the teardown of its own
    process group (a pause at exit, the group destroyed where it never was) change."""
    import difflib

    for d in DISTRIBUTED_LEGACY:
        before = (d / "input.py").read_text().splitlines()
        # unwrapped: the flag's line may be longer than 88 columns (expected_apex.py wraps it)
        after = convert_source(
            "\n".join(before) + "\n", Options(amp="apex", line_length=0)
        ).source.splitlines()
        diff = [
            ln
            for ln in difflib.unified_diff(before, after, lineterm="", n=0)
            if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
        ]
        removed = [ln[1:] for ln in diff if ln.startswith("-")]
        added = [ln[1:].strip() for ln in diff if ln.startswith("+")]
        assert len(removed) == 1 and "--local_rank" in removed[0], removed
        flag = [
            ln
            for ln in added
            if ln.startswith(("parser.add_argument", "FLAGS", "parser"))
        ]
        assert (
            len(flag) == 1
            and '"--local-rank", "--local_rank"' in flag[0]
            and "LOCAL_RANK" in flag[0]
        ), added
        rest = [ln for ln in added if ln not in flag]
        allowed = (
            "import atexit",
            "import time",
            "# ddpify:",
            "# a pause at exit",
            "atexit.register(time.sleep, 0.2)",
            "if torch.distributed.is_initialized():",
            "torch.distributed.destroy_process_group()",
        )
        assert all(ln.startswith(allowed) for ln in rest), rest
        assert "atexit.register(time.sleep, 0.2)" in rest
