"""Small CLI promises from the first ten minutes of use (issue: reliability)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpify import Options, convert_source

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = (ROOT / "examples/train.py").read_text()


@pytest.mark.parametrize(
    "amp, said",
    [
        ("auto", "bf16 where the GPU has it, else fp16; off on CPU"),
        ("bf16", "bf16 on GPUs, chosen by --amp bf16; off on CPU"),
        ("fp16", "fp16 with loss scaling on GPUs, chosen by --amp fp16; off on CPU"),
    ],
)
def test_ddp040_says_which_precision(amp, said):
    result = convert_source(EXAMPLE, Options(amp=amp))
    (f,) = [f for f in result.findings if f.code == "DDP040"]
    assert f.message == f"forward pass and loss run under torch.autocast ({said})"


def test_no_precision_no_ddp040():
    result = convert_source(EXAMPLE, Options(amp="none"))
    assert not [f for f in result.findings if f.code == "DDP040"]
    assert "autocast" not in result.source
