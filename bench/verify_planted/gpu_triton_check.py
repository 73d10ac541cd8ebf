"""On a GPU with triton: the kernel of tests/verify_cases/late/triton_single.py compiles, and the
same kernel as the planted conversion (triton_ddp.py) edited it, with `if RANK == 0:` around its
tl.store, does not. The CPU run of verify never compiles either (no triton there); its gpu-paths
check fails the planted one.

    python bench/verify_planted/gpu_triton_check.py      # result: gpu_triton.txt
"""

import os

import torch
import triton
import triton.language as tl

print("torch", torch.__version__, "triton", triton.__version__)
RANK = int(os.environ.get("RANK", 1))


@triton.jit
def original(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale, mask=mask)


@triton.jit
def planted(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if RANK == 0:
        tl.store(out_ptr + offs, x * scale, mask=mask)


x = torch.randn(1000, device="cuda")
for name, kernel in (("original", original), ("planted", planted)):
    out = torch.zeros_like(x)
    try:
        kernel[(triton.cdiv(1000, 256),)](x, out, 1000, 0.5, BLOCK=256)
        torch.cuda.synchronize()
        print(name, "compiled; max err", (out - x * 0.5).abs().max().item())
    except Exception as e:
        print(name, "FAILED:", type(e).__name__, str(e).strip().splitlines()[-1][:300])
