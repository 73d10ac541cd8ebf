"""Every expected output trains on CPU: as plain `python` (forked from a process that imported
torch once, see forkrun.py) and under torchrun with 2 ranks and gloo. Project fixtures run in
tests/test_projects.py (the converted folder under torchrun, its modules imported alone)."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
from conftest import FIXTURES, clean_env, fixture_args, fixture_options, free_port, is_refused

torch = pytest.importorskip("torch")

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


def skip_apex(d):
    if is_refused(d):
        pytest.skip("refused (blocking finding): the output is the input, nothing distributed to run")
    if fixture_options(d).get("amp") == "apex":
        pytest.skip("the --amp apex output needs NVIDIA apex <= 25.04 (run on GPUs: bench/gpu_session/)")


def test_runs_as_plain_python(fixture_dir, tmp_path, forkrun):
    skip_apex(fixture_dir)
    run = forkrun.run(fixture_dir / "expected.py", fixture_args(fixture_dir), tmp_path)
    check_trained(run.returncode, run.stdout, run.stderr)


# The real torchrun (its agent, c10d rendezvous, per-rank logs and the interpreter's own exit)
# for fixtures of different styles; every other output runs as 2 ranks forked from one process
# that imported torch (forkrun.py): the same torchrun environment variables and process group,
# without ~6 s of imports per run (the suite's time budget, README "Run the tests").
REAL_TORCHRUN = {
    "01_toplevel_regression", "03_trainer_dataclass", "13_checkpoint_resume", "14_early_stopping",
    "16_tqdm_pbar_postfix", "20_gan", "29_autoencoder_two_optimizers", "37_model_choice_branches",
    "38_dict_batches_early_stop", "39_dataset_in_memory_blobs", "51_trainer_move_in_init",
    "63_prepare_if_missing", "73_semi_supervised_zip", "76_optional_optimizer_lm",
}


def test_real_torchrun_set_exists():
    names = {d.name for d in FIXTURES}
    assert REAL_TORCHRUN <= names, sorted(REAL_TORCHRUN - names)


def test_runs_as_two_ranks(fixture_dir, tmp_path, forkrun):
    skip_apex(fixture_dir)
    if fixture_dir.name in REAL_TORCHRUN:
        return _under_torchrun(fixture_dir, tmp_path)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run = forkrun.run(fixture_dir / "expected.py", fixture_args(fixture_dir), tmp_path, nproc=2, env=env)
    assert not run.timed_out, run.stderr[-4000:]
    check_trained(run.returncode, run.ranks[0].stdout, run.stderr)
    # rank 0 alone prints the losses: rank 1's own stdout has none
    assert not LOSS.search(run.ranks[1].stdout), run.ranks[1].stdout[-2000:]


def _under_torchrun(fixture_dir, tmp_path):
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--log-dir={logs}", "--redirects=3", "--tee=3",
           str(fixture_dir / "expected.py"), *fixture_args(fixture_dir)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env())
    check_trained(proc.returncode, proc.stdout, proc.stderr)
    # rank 0 alone prints the losses: rank 1's own stdout has none
    rank1 = next(logs.glob("*/attempt_0/1/stdout.log")).read_text()
    assert not LOSS.search(rank1), rank1[-2000:]
