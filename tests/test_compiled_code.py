"""Compiled code is never edited or guarded: a function under a compiler's decorator (Triton,
TorchScript, Numba) and C++/CUDA sources handed to an extension builder. A guard there reads a
Python global a kernel cannot read, and `tl.store` writes device memory, not a file."""

from __future__ import annotations

import textwrap

import pytest

from ddpify import Options, convert_source
from ddpify.analysis.kernels import compiled_lines

TRAIN = """
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
"""

CASES = {
    "triton": """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[], key=["n"])
@triton.jit
def copy_kernel(x_ptr, output_ptrs, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(output_ptrs + offs, tl.load(x_ptr + offs), mask=offs < n)
    print("block", BLOCK)
""",
    "torchscript": """
import torch
import torch.nn as nn


@torch.jit.script
def checked(x: torch.Tensor, out_file: str) -> torch.Tensor:
    print("checked", x.shape)
    return x
""",
    "numba": """
import torch
import torch.nn as nn
from numba import cuda, njit


@cuda.jit
def fill(out_file, value):
    out_file[cuda.grid(1)] = value


@njit(cache=True)
def count(xs):
    print("counting", len(xs))
    return len(xs)
""",
    "extension": '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
__global__ void k(float* out) { printf("cuda"); }
"""
ext = load_inline(name="k", cpp_sources=["void k();"], cuda_sources=[cuda_src], functions=["k"])
''',
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_code_is_left_as_written(name):
    src = textwrap.dedent(CASES[name]).lstrip() + TRAIN
    lines = compiled_lines(src)
    assert lines, "the compiled code was not recognised"
    kept = [src.splitlines()[i - 1] for i in sorted(lines)]
    res = convert_source(src, Options())
    assert res.changed and not res.blocking, res.findings
    out = res.source.splitlines()
    # every compiled line is in the output as it was, and in the same order
    at = 0
    for line in kept:
        assert line in out[at:], f"changed: {line!r}\n{res.source}"
        at = out.index(line, at) + 1
    assert all(f.line not in lines for f in res.findings), res.findings
    # the training script's own print is still guarded: only compiled code is exempt
    assert 'if RANK == 0:\n    print("loss", loss.item())' in res.source


def test_a_plain_function_named_like_a_kernel_is_converted():
    src = (
        "import torch\nimport torch.nn as nn\n\n\ndef jit(f):\n    return f\n\n\n@jit\ndef report(x):\n    print(x)\n"
        + TRAIN
    )
    assert not compiled_lines(src)  # the script's own `jit` compiles nothing
    res = convert_source(src, Options())
    assert "        print(x)" in res.source
