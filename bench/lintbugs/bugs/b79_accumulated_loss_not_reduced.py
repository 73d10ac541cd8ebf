"""The loss accumulated over micro-steps is printed by rank 0 without a reduction across ranks.

Source: https://github.com/karpathy/llm.c/pull/551
Cause, as stated there: the C implementation reduces the loss before printing it; in the PyTorch
script the losses were not reduced, which made the two look divergent; the fix reduces the
accumulated loss outside the gradient-accumulation loop.
Kind: silent-wrong. Family: metric-one-shard.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def print0(*args):
    if dist.get_rank() == 0:
        print(*args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    tokens = torch.randint(0, 32, (4096,))
    model = DDP(nn.Sequential(nn.Embedding(32, 24), nn.Linear(24, 32)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    pos = rank * 16
    for step in range(args.steps):
        lossf = 0.0
        for micro in range(args.grad_accum):
            x, y = tokens[pos : pos + 16], tokens[pos + 1 : pos + 17]
            pos += 16 * world
            model.require_backward_grad_sync = micro == args.grad_accum - 1
            loss = nn.functional.cross_entropy(model(x), y) / args.grad_accum
            lossf += loss.detach()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print0(f"step {step + 1}/{args.steps} | train loss {lossf.item():.6f}")  # expect: metric-one-shard
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
