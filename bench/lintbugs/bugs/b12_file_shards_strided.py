"""Shard files are dealt to the ranks with a stride; 5 files do not divide by 2 ranks.

Source: https://github.com/deepspeedai/DeepSpeed/issues/2223
Cause, as stated there: each process trains on a different number of batches and gets stuck in
the step (the engine's all-reduce); the issue disappears when every process gets the same
number of batches.
Kind: hang. Family: uneven-batches.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def shard_files(root, count):
    os.makedirs(root, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(root, f"shard{i:02d}.pt")
        if dist.get_rank() == 0:
            torch.save(torch.randn(16, 9, generator=torch.Generator().manual_seed(i)), path)
        paths.append(path)
    dist.barrier()
    return paths


def batches(paths, batch_size):
    for path in paths:
        rows = torch.load(path)
        for k in range(0, len(rows), batch_size):
            yield rows[k:k + batch_size, :8], rows[k:k + batch_size, 8:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    files = shard_files(os.path.join(args.out, "shards"), 5)
    mine = files[rank::world]
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in batches(mine, 8):  # expect: uneven-batches
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
