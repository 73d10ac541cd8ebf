"""Every fixture input.py is a working single-GPU script: it runs on CPU and trains."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CUDA_MARK = "# requires: cuda"
MAX_CUDA_ONLY = 5

# A number right after the word "loss" (allowing "_loss", "Loss:", "loss=", "loss: ", "Loss_D: ").
LOSS_NUMBER = re.compile(
    r"loss\w*\W{0,3}?\s*([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)",
    re.IGNORECASE,
)


def fixture_inputs() -> list[Path]:
    return sorted(FIXTURES.glob("*/input.py"))


def needs_cuda(path: Path) -> bool:
    first = path.read_text(encoding="utf-8").splitlines()[:1]
    return bool(first) and first[0].strip() == CUDA_MARK


def script_args(path: Path) -> list[str]:
    args_file = path.parent / "args.txt"
    if not args_file.exists():
        return []
    return shlex.split(args_file.read_text(encoding="utf-8").strip())


def loss_values(text: str) -> list[float]:
    return [float(m.group(1)) for m in LOSS_NUMBER.finditer(text)]


RUNNABLE = [p for p in fixture_inputs() if not needs_cuda(p)]


def test_fixture_set_shape():
    inputs = fixture_inputs()
    assert len(inputs) >= 30
    names = [p.parent.name for p in inputs]
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+", n) for n in names), names
    assert len(inputs) - len(RUNNABLE) <= MAX_CUDA_ONLY


@pytest.mark.parametrize("path", fixture_inputs(), ids=lambda p: p.parent.name)
def test_fixture_is_single_gpu(path: Path):
    src = path.read_text(encoding="utf-8")
    for banned in ("torch.distributed", "DistributedDataParallel", "mp.spawn", "torchvision", "torch.hub"):
        assert banned not in src, f"{path.parent.name} uses {banned}"
    assert "torch.manual_seed" in src
    assert 30 <= len(src.splitlines()) <= 120


def test_loss_parser():
    text = "Train Epoch: 1 [0/192 (0%)]\tLoss: 2.302585\nepoch 0 train_loss=0.5 val_loss=nan\n[0/3] Loss_D: 1.2e-1"
    assert loss_values(text)[:2] == [2.302585, 0.5]
    assert math.isnan(loss_values(text)[2])
    assert loss_values(text)[3] == pytest.approx(0.12)


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.parent.name)
def test_fixture_runs_on_cpu(path: Path, tmp_path: Path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    before = sorted(p.name for p in path.parent.iterdir())
    proc = subprocess.run(
        [sys.executable, str(path), *script_args(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    # tqdm and logging may write to stderr; the loss may be in either stream
    values = loss_values(proc.stdout + "\n" + proc.stderr)
    finite = [v for v in values if math.isfinite(v)]
    assert len(finite) >= 2, f"expected a finite loss per epoch, got {values}\n{proc.stdout[-2000:]}"
    assert not any(math.isnan(v) for v in values), f"nan loss: {values}"
    # whatever the script writes goes to its working directory, not next to the fixture
    assert sorted(p.name for p in path.parent.iterdir()) == before
