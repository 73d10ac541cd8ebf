"""The DistributedSampler shuffles, but set_epoch is never called: every epoch has the same order.

Source: https://github.com/pytorch/pytorch/issues/31771
Cause, as stated there: DistributedSampler seeds its shuffle with the epoch, so set_epoch(epoch)
must be called at the beginning of each epoch, before the DataLoader iterator is created;
otherwise the same ordering is always used.
Kind: silent-wrong. Family: data-sharding.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomDataset(Dataset):
    def __init__(self):
        self.data = torch.rand(40, 1, 8, 8)
        self.name = torch.arange(40)

    def __getitem__(self, idx):
        return self.name[idx], self.data[idx]

    def __len__(self):
        return len(self.data)


parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.parse_args()
torch.distributed.init_process_group(backend="gloo")
dataset = RandomDataset()
sampler = DistributedSampler(dataset, shuffle=True)
dataloader = DataLoader(dataset, batch_size=5, drop_last=True, sampler=sampler)
model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(3):  # expect: data-sharding
    for i, (names, images) in enumerate(dataloader):
        opt.zero_grad()
        model(images).pow(2).mean().backward()
        opt.step()
dist.destroy_process_group()
