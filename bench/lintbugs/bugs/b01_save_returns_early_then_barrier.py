"""A trainer's save() returns early on every rank but 0, then rank 0 waits in a barrier alone.

Source: https://github.com/EleutherAI/sparsify/pull/5
Cause, as stated there: the first `if` in `save()` makes the other processes leave the function
immediately, so only rank 0 reaches `dist.barrier()`; removing the early return so that every
process reaches the barrier fixes the hang after the first save.
Kind: hang. Family: rank-collective.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Trainer:
    def __init__(self, out):
        self.out = out
        self.rank = dist.get_rank()
        self.model = DDP(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        data = TensorDataset(torch.randn(64, 16))
        self.sampler = DistributedSampler(data)
        self.loader = DataLoader(data, batch_size=8, sampler=self.sampler)

    def save(self):
        if self.rank != 0:
            return
        torch.save(self.model.module.state_dict(), os.path.join(self.out, "sae.pt"))
        dist.barrier()  # expect: rank-collective

    def fit(self, epochs=3):
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            for (x,) in self.loader:
                loss = (self.model(x) - x).pow(2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            self.save()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    Trainer(args.out).fit()
    dist.destroy_process_group()
