"""Wrong conversions verify once passed, each in the shape of the script that showed it, with a
passing control: a rank that divides by its disabled progress bar's counter at the end of an
epoch (past the steps verify once stopped at), a triton kernel the conversion edited (the CPU run
never compiles it), a shared module that breaks the project's inference script, a momentum
encoder that differs across ranks, and a conversion that runs only under torchrun.

Each runs the default length (two passes over each rank's shard) with the one-process baseline,
the converted script as plain python, and torchrun with 2 gloo processes. The conversion is the
hand-made one next to the original (verify's `converter` hook, or the project's converter
replaced), so each fails for its one planted cause."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ddpify.verify import run_verify  # noqa: E402

CASES = Path(__file__).parent / "verify_cases"
LATE = CASES / "late"
TIMEOUT = 120.0


def _verify(tmp_path, script: Path, converted: str, timeout: float = TIMEOUT, **kw):
    from ddpify import Result

    def converter(source, options, path):
        return Result(source=converted, changed=True, status="converted")

    lines: list[str] = []
    outcome = run_verify(str(script), ["--out", str(tmp_path)], nproc=2, backend="gloo", timeout=timeout,
                         echo=lines.append, converter=converter, **kw)  # fmt: skip
    return outcome, "\n".join(lines)


def _check(outcome, name):
    return next(c for c in outcome.checks if c.name == name)


def _failed(outcome) -> set[str]:
    return {c.name for c in outcome.checks if c.status == "FAIL"}


# ---------------------------------------------------------------------------- the end of an epoch

PBAR_BUG = "        epoch_loss = total / pbar.n\n"
PBAR_FIX = "        epoch_loss = total / len(loader)\n"


@pytest.mark.runs
def test_a_rank_dividing_by_its_disabled_progress_bar_fails_at_the_end_of_the_epoch(
    tmp_path, monkeypatch
):
    """24 batches a rank: the default run reaches the end of the epoch (16 a pass, capped), where
    rank 1 divides by the counter of a bar it disabled."""
    monkeypatch.chdir(tmp_path)
    outcome, text = _verify(
        tmp_path, LATE / "pbar_single.py", (LATE / "pbar_ddp.py").read_text()
    )
    assert outcome.exit_code == 1, text
    assert _failed(outcome) == {"ranks"}, text
    cause = _check(outcome, "ranks").cause
    line = (LATE / "pbar_single.py").read_text().splitlines().index(
        PBAR_BUG.rstrip("\n")
    ) + 1
    assert "rank 1 failed first" in cause and "ZeroDivisionError" in cause, cause
    assert f"pbar_single.py:{line}" in cause, cause


@pytest.mark.runs
def test_control_counts_its_own_batches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conv = (LATE / "pbar_ddp.py").read_text()
    assert PBAR_BUG in conv
    outcome, text = _verify(
        tmp_path, LATE / "pbar_single.py", conv.replace(PBAR_BUG, PBAR_FIX)
    )
    assert outcome.exit_code == 0, text
    reached = _check(outcome, "reached").figure
    # each rank went through its (capped) shard twice, and the end of each epoch ran
    assert "2 whole training epochs (16 batches each, capped from 24)" in reached, (
        reached
    )
    assert "torch.save at pbar_single.py" in reached and "2 times" in reached, reached
    assert outcome.document["verdict"].startswith(
        "PASS for 2 passes over each rank's shard and the work at the end of each: the script's end was "
        "not reached, --to-end runs it; ran: 2 whole training epochs (16 batches each, capped from 24)"
    ), text


# ---------------------------------------------------------------------------- a GPU-only kernel

KERNEL_BUG = "        if RANK == 0:\n            tl.store(out_ptr + offs, x * scale, mask=mask)\n"
KERNEL_FIX = "        tl.store(out_ptr + offs, x * scale, mask=mask)\n"


@pytest.mark.runs
def test_a_triton_kernel_the_conversion_edited_fails_on_the_cpu(tmp_path, monkeypatch):
    """No triton here: the script takes its torch path and trains well on every rank; the kernel
    the GPU run compiles now reads RANK, which triton refuses."""
    monkeypatch.chdir(tmp_path)
    outcome, text = _verify(
        tmp_path, LATE / "triton_single.py", (LATE / "triton_ddp.py").read_text()
    )
    assert outcome.exit_code == 1, text
    assert _failed(outcome) == {"gpu-paths"}, text
    check = _check(outcome, "gpu-paths")
    assert "triton kernel `scale_kernel` (triton_single.py" in check.figure, (
        check.figure
    )
    assert (
        "it now reads `RANK`" in check.figure
        and "no longer compiles on a GPU" in check.cause
    )
    assert "`import triton`" in check.cause, (
        check.cause
    )  # the import this run could not take


@pytest.mark.runs
def test_control_kernel_left_alone_passes_and_says_what_the_cpu_skipped(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    conv = (LATE / "triton_ddp.py").read_text()
    assert KERNEL_BUG in conv
    outcome, text = _verify(
        tmp_path, LATE / "triton_single.py", conv.replace(KERNEL_BUG, KERNEL_FIX)
    )
    assert outcome.exit_code == 0, text
    check = _check(outcome, "gpu-paths")
    assert (
        check.status == "INFO"
        and "1 triton kernel never compiled (`scale_kernel`" in check.figure
    )
    assert "on the CPU path" in outcome.document["verdict"], text


# ---------------------------------------------------------------------------- the momentum encoder

MOMENTUM_BUG = """            if rank == 0:
                momentum_update(key_encoder, query_encoder, 0.9)
                if step % 4 == 0:
"""
MOMENTUM_FIX = """            momentum_update(key_encoder, query_encoder, 0.9)
            if rank == 0:
                if step % 4 == 0:
"""


@pytest.mark.runs
def test_a_momentum_encoder_updated_on_rank_0_only_fails_model_state(
    tmp_path, monkeypatch
):
    """The trained encoder stays in sync (DDP averages its gradients): only the whole state
    shows the key encoder, which no optimizer steps, apart on the ranks."""
    monkeypatch.chdir(tmp_path)
    outcome, text = _verify(
        tmp_path, LATE / "momentum_single.py", (LATE / "momentum_ddp.py").read_text()
    )
    assert outcome.exit_code == 1, text
    assert _failed(outcome) == {"model-state"}, text
    assert _check(outcome, "params-in-sync").status == "PASS", text
    check = _check(outcome, "model-state")
    assert check.figure.startswith(
        "`key_encoder` differs across ranks at the checkpoint saved after step 4 (momentum_single.py:"
    ), check.figure
    assert (
        "which no optimizer steps" in check.cause and "some ranks only" in check.cause
    )


@pytest.mark.runs
def test_control_momentum_update_on_every_rank(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conv = (LATE / "momentum_ddp.py").read_text()
    assert MOMENTUM_BUG in conv
    outcome, text = _verify(
        tmp_path, LATE / "momentum_single.py", conv.replace(MOMENTUM_BUG, MOMENTUM_FIX)
    )
    assert outcome.exit_code == 0, text
    figure = _check(outcome, "model-state").figure
    assert (
        "`query_encoder`, `key_encoder`" in figure
        and "at the end and at 1 checkpoint" in figure
    ), figure


# ---------------------------------------------------------------------------- plain python

SETUP_BUG = '    local_rank = int(os.environ["LOCAL_RANK"])\n    dist.init_process_group("gloo")\n'
SETUP_FIX = """    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain python: a world of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
"""


@pytest.mark.runs
def test_a_conversion_that_runs_only_under_torchrun_fails(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outcome, text = _verify(
        tmp_path, LATE / "setup_single.py", (LATE / "torchrun_only_ddp.py").read_text()
    )
    assert outcome.exit_code == 1, text
    assert _failed(outcome) == {"one-process"}, text
    check = _check(outcome, "one-process")
    assert "runs under torchrun but not as a plain python process" in check.cause, (
        check.cause
    )
    assert (
        "KeyError: 'LOCAL_RANK'" in check.cause
        and "setup_single.py, converted line" in check.cause
    )
    assert f"`python setup_single.py --out {tmp_path}`" in check.figure, check.figure


@pytest.mark.runs
def test_control_runs_both_ways(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conv = (LATE / "torchrun_only_ddp.py").read_text()
    assert SETUP_BUG in conv
    outcome, text = _verify(
        tmp_path, LATE / "setup_single.py", conv.replace(SETUP_BUG, SETUP_FIX)
    )
    assert outcome.exit_code == 0, text
    assert _check(outcome, "one-process").status == "PASS", text


# ---------------------------------------------------------------------------- the project's other scripts

BARRIER_BUG = "    dist.barrier()  # rank 0 saved the checkpoint: wait for it\n"
BARRIER_FIX = "    if dist.is_initialized():\n        dist.barrier()  # rank 0 saved the checkpoint: wait for it\n"


def _project(tmp_path, monkeypatch, model_text: str):
    """The project in tmp_path, and ddpify's project converter replaced by the hand-made
    conversion of its train.py and model.py (infer.py is left as it is, as a converter would)."""
    import ddpify.project
    from ddpify.project import FileResult, ProjectResult

    root = tmp_path / "repo"
    shutil.copytree(CASES / "projects" / "shared_load", root)
    converted = {"train.py": (CASES / "projects" / "shared_load_converted" / "train.py").read_text(),
                 "model.py": model_text}  # fmt: skip

    def convert_project(entry, options=None, read=None):
        files = []
        for name in ("train.py", "model.py", "infer.py"):
            source = (root / name).read_text()
            files.append(
                FileResult(str(root / name), source, converted.get(name, source))
            )
        return ProjectResult(str(root / "train.py"), str(root), "converted", files)

    monkeypatch.setattr(ddpify.project, "convert_project", convert_project)
    monkeypatch.chdir(root)
    lines: list[str] = []
    outcome = run_verify(str(root / "train.py"), ["--out", str(tmp_path)], nproc=2, backend="gloo", timeout=TIMEOUT,
                         echo=lines.append)  # fmt: skip
    return outcome, "\n".join(lines)


@pytest.mark.runs
def test_a_shared_helper_that_breaks_the_inference_script_fails(tmp_path, monkeypatch):
    """Training passes (load() is never called there); infer.py --dry-run calls it in a plain
    python process, where the barrier has no process group."""
    model = (CASES / "projects" / "shared_load_converted" / "model.py").read_text()
    outcome, text = _project(tmp_path, monkeypatch, model)
    assert outcome.exit_code == 1, text
    assert _failed(outcome) == {"other-scripts"}, text
    check = _check(outcome, "other-scripts")
    assert check.figure.startswith(
        "`infer.py --dry-run`: exit 1 after the conversion, exit 0 before"
    ), check.figure
    assert "the conversion changed model.py, which infer.py imports" in check.cause, (
        check.cause
    )
    assert "Default process group has not been initialized" in check.cause, check.cause
    assert "model.py, converted line" in check.cause, check.cause


@pytest.mark.runs
def test_control_guarded_barrier_keeps_the_inference_script(tmp_path, monkeypatch):
    model = (CASES / "projects" / "shared_load_converted" / "model.py").read_text()
    assert BARRIER_BUG in model
    outcome, text = _project(
        tmp_path, monkeypatch, model.replace(BARRIER_BUG, BARRIER_FIX)
    )
    assert outcome.exit_code == 0, text
    figure = _check(outcome, "other-scripts").figure
    assert (
        "1 other script importing a changed module, as plain python: `infer.py --dry-run` ran"
        in figure
    )


# ---------------------------------------------------------------------------- a collective on rank 0

EVAL_BUG = "            acc = evaluate(ddp_model, DataLoader(val, batch_size=8))\n"
EVAL_FIX = "            acc = evaluate(model, DataLoader(val, batch_size=8))\n"


@pytest.mark.runs
def test_an_evaluation_through_ddp_on_rank_0_hangs_at_the_end_of_the_epoch(
    tmp_path, monkeypatch
):
    """Rank 0 evaluates through the DDP model at the end of each epoch (24 batches a rank, past
    the 20 steps verify once stopped at): its first forward broadcasts the BatchNorm buffers
    while rank 1 waits in the barrier after the rank-0 block."""
    monkeypatch.chdir(tmp_path)
    outcome, text = _verify(
        tmp_path,
        LATE / "eval_single.py",
        (LATE / "eval_rank0_ddp.py").read_text(),
        timeout=30.0,
    )
    assert outcome.exit_code == 1, text
    assert "no-hang" in _failed(outcome), text
    cause = _check(outcome, "no-hang").cause
    assert "rank 0 the DDP forward (buffer broadcast) at eval_single.py:16" in cause, (
        cause
    )
    assert "rank 1 barrier at eval_single.py, converted line" in cause, cause


@pytest.mark.runs
def test_control_evaluates_the_plain_module_on_rank_0(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conv = (LATE / "eval_rank0_ddp.py").read_text()
    assert EVAL_BUG in conv
    outcome, text = _verify(
        tmp_path, LATE / "eval_single.py", conv.replace(EVAL_BUG, EVAL_FIX)
    )
    assert outcome.exit_code == 0, text
    assert _check(outcome, "collectives").figure.startswith(
        "every rank entered the same"
    ), text


# ---------------------------------------------------------------------------- DDP applied in place

EMA_FIX = """            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.lerp_(p, 0.1)
"""
EMA_BUG = """            with torch.no_grad():
                if rank == 0:
                    for e, p in zip(ema.parameters(), model.parameters()):
                        e.lerp_(p, 0.1)
"""


def _replicated(tmp_path, text: str):
    script = tmp_path / "replicate_inplace.py"
    script.write_text(text)
    lines: list[str] = []
    outcome = run_verify(str(script), ["--out", str(tmp_path)], nproc=2, backend="gloo", timeout=TIMEOUT,
                         echo=lines.append, baseline=False, convert=False)  # fmt: skip
    return outcome, "\n".join(lines)


@pytest.mark.runs
def test_a_model_replicated_in_place_is_the_model(tmp_path, monkeypatch):
    """replicate(model): one object, class DDPNet, plain state_dict keys; found as the model
    (parameters in sync, its state and its EMA compared, its checkpoint loads)."""
    monkeypatch.chdir(tmp_path)
    text = (CASES / "replicate_inplace.py").read_text()
    assert EMA_FIX in text
    outcome, out = _replicated(tmp_path, text)
    assert outcome.exit_code == 0, out
    figure = _check(outcome, "model-state").figure
    assert "`model`, `ema`, at the end and at 1 checkpoint" in figure, figure
    assert (
        _check(outcome, "saved").figure == "2 state dicts load into the unwrapped model"
    )


@pytest.mark.runs
def test_an_ema_of_a_replicated_model_updated_on_rank_0_only_fails(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    text = (CASES / "replicate_inplace.py").read_text().replace(EMA_FIX, EMA_BUG)
    outcome, out = _replicated(tmp_path, text)
    assert outcome.exit_code == 1, out
    assert _failed(outcome) == {"model-state"}, out
    assert _check(outcome, "model-state").figure.startswith(
        "`ema` differs across ranks at the checkpoint saved after step 4"
    ), out


@pytest.mark.runs
def test_a_script_that_pickles_its_whole_model_is_not_broken_by_the_probe(
    tmp_path, monkeypatch
):
    """torch.save(model, path) of a model made distributed in place: the probe watches its
    forward through global hooks, so the model holds nothing of the probe that cannot pickle."""
    monkeypatch.chdir(tmp_path)
    fixture = CASES.parent.parent / "fixtures" / "240_train_fn_saves_whole_model"
    text = (fixture / "expected.py").read_text()
    assert "torch.save(model," in text and "ddp_in_place(model" in text
    script = tmp_path / "train.py"
    script.write_text(text)
    lines: list[str] = []
    outcome = run_verify(str(script), ["--out", str(tmp_path)], nproc=2, backend="gloo", timeout=TIMEOUT,
                         echo=lines.append, baseline=False, convert=False)  # fmt: skip
    assert outcome.exit_code == 0, "\n".join(lines)
    assert _check(outcome, "ranks").status == "PASS"


# ---------------------------------------------------------------------------- the collectives check


def _records(tmp_path, seqs: dict[int, list], sites: list) -> object:
    from ddpify.verify.checks import Context
    from ddpify.verify.runner import RunResult

    run = RunResult("candidate", 2, tmp_path)
    run.records = {
        r: {
            "status": "finished",
            "steps": 4,
            "collective_seq": seq,
            "collective_sites": sites,
        }
        for r, seq in seqs.items()
    }
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "if rank == 0:\n"
        "    prepare()\n"
        "    dist.barrier()\n"
        "else:\n"
        "    dist.barrier()\n"
        "if rank == 0:\n"
        "    evaluate(ddp_model)\n"
        "dist.barrier()\n"
    )
    return Context(run, None, 2, 4, str(script))


def test_complementary_barriers_at_two_lines_are_one_collective(tmp_path):
    """Rank 0 prepares the data and meets the others at a barrier in its branch, they wait in
    theirs: one barrier each, at different lines, in the same turn."""
    from ddpify.verify.checks.hang import check_collectives

    sites = [
        [f"barrier\t{tmp_path}/train.py:4"],
        [f"barrier\t{tmp_path}/train.py:6"],
        [f"backward\t{tmp_path}/train.py:9"],
    ]
    ctx = _records(
        tmp_path,
        {
            0: [["barrier", 0], ["all_reduce", 2]],
            1: [["barrier", 1], ["all_reduce", 2]],
        },
        sites,
    )
    check = check_collectives(ctx)
    assert check.status == "PASS", check
    assert (
        check.figure == "every rank entered the same 2 collectives, in the same order"
    )


def test_a_broadcast_where_the_others_are_in_a_barrier_fails(tmp_path):
    from ddpify.verify.checks.hang import check_collectives

    sites = [
        [f"the DDP forward (buffer broadcast)\t{tmp_path}/train.py:8"],
        [f"barrier\t{tmp_path}/train.py:9"],
    ]
    ctx = _records(
        tmp_path, {0: [["broadcast", 0], ["barrier", 1]], 1: [["barrier", 1]]}, sites
    )
    check = check_collectives(ctx)
    assert check.status == "FAIL", check
    assert check.figure == (
        "collective #1: rank 0 a broadcast (the DDP forward (buffer broadcast) at train.py:8, inside "
        "`if rank == 0:` (train.py:7)); rank 1 a barrier (barrier at train.py:9)"
    ), check.figure
