"""Every expected output trains on CPU: as plain `python` and under torchrun (2 ranks, gloo)."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys

import pytest
from conftest import fixture_args, fixture_options, needs_cuda

torch = pytest.importorskip("torch")

LOSS = re.compile(r"loss\D{0,20}?(-?\d+(?:\.\d+)?(?:e-?\d+)?|nan|inf)", re.I)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_trained(proc, nprint_max=None):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    losses = [float(x) for x in LOSS.findall(proc.stdout)]
    assert losses, f"no loss printed:\n{out[-2000:]}"
    assert all(math.isfinite(x) for x in losses), losses
    return losses


def env():
    e = dict(os.environ)
    e.pop("WORLD_SIZE", None)
    e.pop("MASTER_ADDR", None)
    e["OMP_NUM_THREADS"] = "1"
    return e


def skip_apex(d):
    if fixture_options(d).get("amp") == "apex":
        pytest.skip("the --amp apex output needs NVIDIA apex <= 25.04 (run on GPUs: bench/gpu_session/)")


def test_runs_as_plain_python(fixture_dir, tmp_path):
    skip_apex(fixture_dir)
    if needs_cuda(fixture_dir) and not torch.cuda.is_available():
        pass  # the converted script no longer needs CUDA: .cuda() became .to(LOCAL_DEVICE)
    script = fixture_dir / "expected.py"
    proc = subprocess.run([sys.executable, str(script), *fixture_args(fixture_dir)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env())
    check_trained(proc)


def test_runs_under_torchrun(fixture_dir, tmp_path):
    skip_apex(fixture_dir)
    script = fixture_dir / "expected.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script), *fixture_args(fixture_dir)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env())
    check_trained(proc)
    # rank 0 alone prints: every loss line appears once, not once per rank
    assert "[rank1]" not in proc.stdout
