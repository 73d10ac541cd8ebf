"""A hand-written sampler gives each rank a contiguous chunk of ceil(n / world) samples; the last
rank gets what is left.

Source: https://discuss.pytorch.org/t/training-hangs-on-loss-backward-with-ddp-nnodes-2-nproc-per-node-3/220127
Cause, as stated in the answer: training hangs in loss.backward() when the ranks do not use the
same number of batches.
Kind: hang. Family: uneven-batches.
"""

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, TensorDataset


class ChunkSampler(Sampler):
    def __init__(self, n, rank, world):
        size = math.ceil(n / world)
        start = rank * size
        stop = min(n, start + size)
        self.indices = list(range(start, stop))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


class Trainer:
    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        data = TensorDataset(torch.randn(65, 4), torch.randn(65, 2))
        self.loader = DataLoader(data, batch_size=8, sampler=ChunkSampler(len(data), self.rank, self.world))
        self.model = DDP(nn.Linear(4, 2))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def epoch(self):
        for x, y in self.loader:  # expect: uneven-batches
            loss = nn.functional.smooth_l1_loss(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    t = Trainer()
    for _ in range(2):
        t.epoch()
    dist.destroy_process_group()
