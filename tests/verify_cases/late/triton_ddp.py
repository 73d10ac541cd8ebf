"""A wrong conversion of triton_single.py: the rank-0 guard went inside the triton kernel, around
its `tl.store`, which is a write to GPU memory, not a file. The kernel now reads the Python global
RANK, which triton cannot compile; on a CPU machine triton is missing and the kernel never
compiles, so the run passes there."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # no triton (a CPU machine): the torch path below
    HAS_TRITON = False

if HAS_TRITON:

    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        if RANK == 0:
            tl.store(out_ptr + offs, x * scale, mask=mask)


def scale(x, s):
    if HAS_TRITON and x.is_cuda:
        out = torch.empty_like(x)
        n = x.numel()
        scale_kernel[(triton.cdiv(n, 256),)](x, out, n, s, BLOCK=256)
        return out
    return x * s


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return scale(self.body(x).contiguous(), 0.5)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    if torch.cuda.is_available():
        device = torch.device("cuda", LOCAL_RANK)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:  # plain python: a world of one
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = Net().to(device)
    ddp_model = DDP(model, device_ids=[LOCAL_RANK] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if RANK == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
            torch.save(model.state_dict(), os.path.join(args.out, "net.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
