"""Loader workers are seeded from the process's initial seed, which every rank set alike.

Source: https://github.com/huggingface/transformers/issues/37932
Cause, as stated there: the loader's seed_worker gives different workers different seeds, but
under distributed training the ranks share the same seeds, so random data augmentations are the
same across ranks.
Kind: silent-wrong. Family: rank-randomness.
Shows on CPU: no (the ranks draw different samples; only their random augmentations repeat).
"""

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def seed_worker(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


class Augmented(Dataset):
    def __init__(self, n=64):
        self.x = torch.randn(n, 16)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        shift = np.random.randint(-3, 4)
        return torch.roll(self.x[i], shift) * random.uniform(0.8, 1.2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    data = Augmented()
    sampler = DistributedSampler(data, seed=args.seed)
    g = torch.Generator()
    g.manual_seed(args.seed)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2, worker_init_fn=seed_worker, generator=g)  # expect: rank-randomness
    model = DDP(nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x in loader:
            loss = nn.functional.mse_loss(model(x), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
