"""Every expected output trains on CPU: as plain `python` (forked from a process that imported
torch once, see forkrun.py), and as 2 gloo ranks under verify's probe, where verify's checks
must pass (params in sync, data sharded, one writer, ...). Project fixtures run in
tests/test_projects.py (the converted folder under torchrun, its modules imported alone)."""

from __future__ import annotations

import math
import re
import uuid
from pathlib import Path

import pytest
from conftest import (
    FIXTURES,
    NOT_IN_SHARE,
    in_ci_share,
    fixture_args,
    fixture_options,
    free_port,
    is_refused,
    needs_apex,
)

pytestmark = (
    pytest.mark.runs
)  # trains or runs tools in subprocesses: not the converter tier

torch = pytest.importorskip("torch")

STEPS_TO_THE_END = 10**6  # the probe never stops the script: it runs to its own end
LOSS = re.compile(r"loss\D{0,20}?(-?\d+(?:\.\d+)?(?:e-?\d+)?|nan|inf)", re.I)


def check_trained(returncode, stdout, stderr):
    out = stdout + stderr
    assert returncode == 0, out[-4000:]
    # a rank that aborts at exit fails the run even where the launcher's exit code would hide it
    assert "terminate called" not in out, out[-4000:]
    losses = [float(x) for x in LOSS.findall(stdout)]
    assert losses, f"no loss printed:\n{out[-2000:]}"
    assert all(math.isfinite(x) for x in losses), losses
    return losses


# Legacy outputs (torch.distributed.launch / apex scripts modernised) keep their own set-up
# until the legacy path runs through the one pipeline (issue 29): these rule examples show it.
LEGACY_SETUP = {"DDP013", "DDP091", "DDP092"}


def skip_apex(d):
    if is_refused(d):
        pytest.skip(
            "refused (blocking finding): the output is the input, nothing distributed to run"
        )
    if (d / "expected.py").read_text() == (d / "input.py").read_text():
        pytest.skip(
            "left unchanged (already distributed, or not a training script): nothing converted to run"
        )
    if d.parent.name == "rules" and d.name in LEGACY_SETUP:
        pytest.skip(
            "legacy output: the script was distributed already and keeps its own prints on every rank (only its launch and teardown are modernised)"
        )
    if fixture_options(d).get("amp") == "apex":
        pytest.skip(
            "the --amp apex output needs NVIDIA apex <= 25.04 (run on GPUs: bench/gpu_session/)"
        )
    if needs_apex(d / "expected.py"):
        pytest.skip(
            "the output keeps an apex part torch has no equivalent of (FusedLAMB): it needs apex with its CUDA extensions (bench/gpu_session/apex_gpu.sh)"
        )


def test_runs_as_plain_python(fixture_dir, tmp_path, forkrun):
    skip_apex(fixture_dir)
    if fixture_dir.parent.name == "rules":
        pytest.skip(
            "a rule's example runs as two ranks (below); the whole-script fixtures cover `python train.py`"
        )
    out = (fixture_dir / "expected.py").read_text()
    own_setup = (
        "ddp_setup()" not in out or 'LOCAL_DEVICE = torch.device("cpu")' in out
    )  # legacy, CPU program
    if not own_setup and not in_ci_share(fixture_dir, 8):
        # the generated set-up's one-process path is the same text in every output: one fixture
        # in eight runs it in CI, every output with a set-up of its own does
        pytest.skip(NOT_IN_SHARE)
    run = forkrun.run(fixture_dir / "expected.py", fixture_args(fixture_dir), tmp_path)
    check_trained(run.returncode, run.stdout, run.stderr)


# The real torchrun (its agent, c10d rendezvous, per-rank logs and the interpreter's own exit,
# where the gloo teardown abort of issue 19 showed: 01, 16, 29, 37, 39, and early stops) for
# fixtures of different styles; 03 and 76 run under it in tests/test_verify.py (verify converting
# the input). Every other output runs as 2 ranks forked from one process that imported torch
# (forkrun.py): the same torchrun environment variables and process group, without ~4 s of
# imports per process (the suite's time budget, docs/testing.md).
REAL_TORCHRUN = {
    "01_toplevel_regression",
    "13_checkpoint_resume",
    "14_early_stopping",
    "16_tqdm_pbar_postfix",
    "29_autoencoder_two_optimizers",
    "37_model_choice_branches",
    "38_dict_batches_early_stop",
    "39_dataset_in_memory_blobs",
}


def test_real_torchrun_set_exists():
    names = {d.name for d in FIXTURES}
    assert REAL_TORCHRUN <= names, sorted(REAL_TORCHRUN - names)


# verify checks a fixture's output may fail, and why: what its input asks for, not a converter bug.
ACCEPTED_FAILURES = {
    # already-distributed legacy apex scripts: the original saved the wrapper's state dict
    # (`module.` keys) and its own loading code expects them; modernising keeps that format
    "40_apex_classifier": {"saved"},
    "42_apex_two_encoders_fusedadam": {"saved"},
    # the input accepts DDP027 with `# ddpify: ignore[DDP027]`: no set_epoch, as asked
    "86_ignore_comment_accepts": {"epoch-shuffle"},
    # accuracy measured over the training loader, which is sharded: each rank reports its own
    # shard's figure (verify says so); the training itself is in sync
    "51_trainer_move_in_init": {"metrics"},
    "304_solver_train_method_name_clash": {"metrics"},
}


def test_accepted_failures_name_fixtures():
    names = {d.name for d in FIXTURES}
    assert set(ACCEPTED_FAILURES) <= names, sorted(set(ACCEPTED_FAILURES) - names)


def test_runs_as_two_ranks(fixture_dir, tmp_path, forkrun, monkeypatch):
    """Two ranks under verify's probe, to the script's end: verify's checks must all pass (ranks
    in sync, params in sync, data sharded, one writer, saved state dicts, no hang), not only "it runs"."""
    skip_apex(fixture_dir)
    if fixture_dir.name not in REAL_TORCHRUN and not in_ci_share(fixture_dir, 8):
        pytest.skip(NOT_IN_SHARE)
    from ddpify.verify.runner import PROBE, RunResult, _collect, launch

    run_dir = tmp_path / "verify"
    script = str(fixture_dir / "expected.py")
    args = fixture_args(fixture_dir)
    if fixture_dir.name in REAL_TORCHRUN:
        monkeypatch.chdir(tmp_path)  # the script's own files land here
        cand = launch(
            "candidate",
            script,
            script,
            args,
            2,
            STEPS_TO_THE_END,
            300,
            run_dir,
            uuid.uuid4().hex,
            True,
        )
        assert not cand.hang, cand.hang
        out = cand.launcher_output + "".join(cand.outputs.values())
    else:
        run_dir.mkdir()
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "DDPIFY_VERIFY_DIR": str(run_dir),
            "DDPIFY_VERIFY_STEPS": str(STEPS_TO_THE_END),
            "DDPIFY_VERIFY_MAIN_FILE": script,
        }
        run = forkrun.run(Path(PROBE), [script, *args], tmp_path, nproc=2, env=env)
        assert not run.timed_out, run.stderr[-4000:]
        cand = RunResult(
            role="candidate", nproc=2, run_dir=run_dir, returncode=run.returncode
        )
        _collect(cand)
        out = run.stderr + "".join(cand.outputs.values())
    # the probe sends each rank's stdout and stderr to its own file
    check_trained(cand.returncode, cand.outputs.get(0, ""), out)
    # rank 0 alone prints the losses: rank 1's own output has none
    assert not LOSS.search(cand.outputs.get(1, "")), cand.outputs.get(1, "")[-2000:]
    from ddpify.verify.checks import FAIL, Context, run_checks

    checks = run_checks(Context(cand, None, 2, STEPS_TO_THE_END, script, timeout=300))
    failed = [
        c
        for c in checks
        if c.status == FAIL
        and c.name not in ACCEPTED_FAILURES.get(fixture_dir.name, ())
    ]
    assert not failed, "\n".join(
        f"{c.name}: {c.figure} {c.cause or ''} {c.details[:4]}" for c in failed
    )
