"""Validation runs on rank 0 only, through the DDP wrapper of a model with BatchNorm.

Source: https://github.com/jpata/particleflow/pull/233
Cause, as stated there: validation is only run on a single GPU, so it must call model.module()
instead of model(); the DDP forward on rank 0 alone makes the next dist.barrier() hang.
Kind: hang. Family: rank-collective.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_net():
    return nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))


def run_validation(net, loader):
    net.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (net(x).argmax(1) == y).sum().item()  # expect: rank-collective
    net.train()
    return correct / len(loader.dataset)


def main(out):
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    train = TensorDataset(torch.randn(64, 12), torch.randint(0, 4, (64,)))
    valid = TensorDataset(torch.randn(32, 12), torch.randint(0, 4, (32,)))
    sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=8, sampler=sampler)
    valid_loader = DataLoader(valid, batch_size=8)
    net = DistributedDataParallel(make_net())
    optim = torch.optim.SGD(net.parameters(), lr=0.05)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            optim.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            optim.step()
        if rank == 0:
            acc = run_validation(net, valid_loader)
            print(f"epoch {epoch} accuracy {acc:.3f}")
            torch.save(net.module.state_dict(), os.path.join(out, "pf.pt"))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    main(p.parse_args().out)
