"""Distributed validation with a DistributedSampler counts the padding duplicates.

Source: https://github.com/pytorch/pytorch/issues/25162
Cause, as stated there: DistributedSampler pads the index list to make it divisible by the number
of processes, duplicating the first samples, which makes the validation accuracy incorrect when
the per-rank counts are summed.
Kind: silent-wrong. Family: metric-one-shard.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def validate(model, loader):
    correct = torch.zeros(1)
    seen = torch.zeros(1)
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
            seen += len(y)
    dist.all_reduce(correct)
    dist.all_reduce(seen)
    return (correct / seen).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    train_set = TensorDataset(torch.randn(64, 6), torch.randint(0, 2, (64,)))
    val_set = TensorDataset(torch.randn(21, 6), torch.randint(0, 2, (21,)))
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=8, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))  # expect: metric-one-shard
    model = DDP(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        acc = validate(model, val_loader)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: val acc {acc:.4f} over 21 samples")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
