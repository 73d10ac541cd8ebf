"""A single-process script whose model scales its output with a triton kernel on a GPU, and with
plain torch where triton or CUDA is missing."""

import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

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
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.state_dict(), os.path.join(args.out, "net.pt"))


if __name__ == "__main__":
    main()
