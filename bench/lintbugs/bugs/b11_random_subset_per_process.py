"""Each process keeps a random subset of the data without a common seed.

Source: https://github.com/Lightning-AI/pytorch-lightning/issues/9851
Cause, as stated there by the maintainers: training hangs when the ranks have an uneven number of
batches; when the data set is selected at random, every process must choose the same one (seed
it the same way on every process).
Kind: hang. Family: uneven-batches.
"""

import argparse
import random

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def build_dataset(full, keep_prob):
    kept = [i for i in range(len(full)) if random.random() < keep_prob]
    return Subset(full, kept)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    random.seed(dist.get_rank() * 7 + 3)
    full = TensorDataset(torch.randn(128, 6), torch.randint(0, 3, (128,)))
    train_set = build_dataset(full, keep_prob=0.5)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=8, sampler=sampler)
    model = DDP(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:  # expect: uneven-batches
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
