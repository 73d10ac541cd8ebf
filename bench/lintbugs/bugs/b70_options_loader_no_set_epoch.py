"""Loaders built from an options dict shuffle with a DistributedSampler that is never told the epoch.

Source: https://github.com/cszn/KAIR/pull/106
Cause, as stated there: the distributed sampler caused the same data order in each epoch:
set_epoch must be called at the start of every epoch (PyTorch's DistributedSampler warning).
Kind: silent-wrong. Family: data-sharding.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

OPT = {
    "datasets": {"train": {"size": 64, "batch": 8, "shuffle": True}},
    "train": {"epochs": 3, "lr": 1e-3},
}


def define_loader(phase, opt):
    size = opt["size"]
    data = TensorDataset(torch.randn(size, 3, 8, 8), torch.randn(size, 3, 8, 8))
    sampler = DistributedSampler(data, shuffle=opt["shuffle"], drop_last=True)
    return DataLoader(data, batch_size=opt["batch"], sampler=sampler, drop_last=True), sampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    loaders = {phase: define_loader(phase, o) for phase, o in OPT["datasets"].items()}
    train_loader, train_sampler = loaders["train"]
    model = DDP(nn.Conv2d(3, 3, 3, padding=1))
    opt = torch.optim.Adam(model.parameters(), lr=OPT["train"]["lr"])
    for epoch in range(OPT["train"]["epochs"]):  # expect: data-sharding
        for low, high in train_loader:
            loss = nn.functional.l1_loss(model(low), high)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
