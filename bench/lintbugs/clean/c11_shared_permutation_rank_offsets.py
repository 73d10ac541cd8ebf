"""Control: the shard permutation uses one seed on every rank; only the augmentation noise is
seeded per rank."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.randn(96, 6)
    model = DDP(nn.Linear(6, 6))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    noise = torch.Generator().manual_seed(args.seed + rank)
    for epoch in range(2):
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(args.seed + epoch))
        mine = order[rank::world]
        for k in range(0, len(mine), 8):
            x = data[mine[k:k + 8]]
            x_aug = x + 0.01 * torch.randn(x.shape, generator=noise)
            opt.zero_grad()
            nn.functional.mse_loss(model(x_aug), x).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
