"""A batch sampler that groups frames by atom count is built with no rank or world size.

Source: https://github.com/deepmodeling/deepmd-kit/pull/5914
Cause, as stated there: the LMDB path constructs a plain SameNlocBatchSampler(...) with no
rank/world_size argument, unlike the backend that swaps in a distributed sampler, so every rank
samples the complete data system independently instead of its share.
Kind: silent-wrong. Family: data-sharding.
Shows on CPU: yes.
"""

import argparse
import random

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler


class Frames(Dataset):
    def __init__(self, n=96):
        g = torch.Generator().manual_seed(0)
        self.nloc = torch.randint(2, 5, (n,), generator=g)
        self.feats = torch.randn(n, 4, generator=g)

    def __len__(self):
        return len(self.nloc)

    def __getitem__(self, i):
        return self.feats[i], self.nloc[i].float()


class SameNlocBatchSampler(Sampler):
    """Batches whose frames all have the same number of atoms, shuffled."""

    def __init__(self, nloc, batch_size, seed=0):
        self.nloc, self.batch_size, self.seed, self.epoch = nloc.tolist(), batch_size, seed, 0

    def __iter__(self):
        rng = random.Random(self.seed + self.epoch)
        groups = {}
        for i, n in enumerate(self.nloc):
            groups.setdefault(n, []).append(i)
        batches = [g[k : k + self.batch_size] for g in groups.values() for k in range(0, len(g), self.batch_size)]
        rng.shuffle(batches)
        return iter(batches)

    def __len__(self):
        return sum(-(-self.nloc.count(n) // self.batch_size) for n in set(self.nloc))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = Frames()
    sampler = SameNlocBatchSampler(data.nloc, batch_size=8)
    loader = DataLoader(data, batch_sampler=sampler)  # expect: data-sharding
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.epoch = epoch
        for x, nloc in loader:
            loss = nn.functional.mse_loss(model(x).squeeze(1), nloc)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
