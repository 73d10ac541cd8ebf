"""Control: evaluation on disjoint shards without padding (each rank takes a strided slice), the
correct-count and the sample count all-reduced before the accuracy is computed and logged."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def evaluate(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = Subset(dataset, range(rank, len(dataset), world))
    stats = torch.zeros(2)
    with torch.no_grad():
        for x, y in DataLoader(shard, batch_size=8):
            stats[0] += (model(x).argmax(1) == y).sum()
            stats[1] += len(y)
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    train = TensorDataset(torch.randn(64, 6), torch.randint(0, 2, (64,)))
    val = TensorDataset(torch.randn(21, 6), torch.randint(0, 2, (21,)))
    sampler = DistributedSampler(train)
    model = DDP(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(train, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        acc = evaluate(model.module, val)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: accuracy {acc:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
