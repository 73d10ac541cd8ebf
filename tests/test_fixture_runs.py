"""Every expected output trains on CPU: as plain `python` and as 2 ranks with gloo, with
torchrun's environment (forked, see forkrun.py); a few under the real torchrun too."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
from conftest import FIXTURES, clean_env, fixture_args, fixture_options, free_port

torch = pytest.importorskip("torch")

LOSS = re.compile(r"loss\D{0,20}?(-?\d+(?:\.\d+)?(?:e-?\d+)?|nan|inf)", re.I)
# the real launcher, on fixtures of different styles (module level, main(), a Trainer class, iterations)
UNDER_TORCHRUN = ["02_mnist_classic", "03_trainer_dataclass", "30_while_max_steps", "36_gpt_param_groups_method"]


def check_trained(returncode, stdout, stderr):
    out = stdout + stderr
    assert returncode == 0, out[-4000:]
    losses = [float(x) for x in LOSS.findall(stdout)]
    assert losses, f"no loss printed:\n{out[-2000:]}"
    assert all(math.isfinite(x) for x in losses), losses
    return losses


def skip_apex(d):
    if fixture_options(d).get("amp") == "apex":
        pytest.skip("the --amp apex output needs NVIDIA apex <= 25.04 (run on GPUs: bench/gpu_session/)")


def test_runs_as_plain_python(fixture_dir, tmp_path, forkrun):
    skip_apex(fixture_dir)
    run = forkrun.run(fixture_dir / "expected.py", fixture_args(fixture_dir), tmp_path)
    check_trained(run.returncode, run.stdout, run.stderr)


def test_runs_on_two_ranks(fixture_dir, tmp_path, forkrun):
    skip_apex(fixture_dir)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run = forkrun.run(fixture_dir / "expected.py", fixture_args(fixture_dir), tmp_path, nproc=2, env=env)
    assert not run.timed_out, run.stderr[-4000:]
    check_trained(run.returncode, run.ranks[0].stdout, run.stderr)
    # rank 0 alone prints the losses
    assert not LOSS.search(run.ranks[1].stdout), run.ranks[1].stdout[-2000:]


@pytest.mark.parametrize("name", UNDER_TORCHRUN)
def test_runs_under_torchrun(name, tmp_path):
    d = FIXTURES[0].parent / name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(d / "expected.py"), *fixture_args(d)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env())
    check_trained(proc.returncode, proc.stdout, proc.stderr)
    assert "[rank1]" not in proc.stdout
