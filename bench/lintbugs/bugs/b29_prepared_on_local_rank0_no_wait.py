"""Local rank 0 prepares the data set; the other ranks read it right away, before it exists.

Source: https://github.com/friendliai/periflow-python-sdk/pull/11
Cause, as stated there: downloading the data set only on local rank 0 still fails with "Dataset
not found or corrupted" on the other processes: they open it before rank 0 has finished (they
must wait for it, at a barrier).
Kind: crash. Family: file-race.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Cifar(Dataset):
    def __init__(self, root, download=False):
        self.file = os.path.join(root, "cifar-batch.pt")
        if download and not os.path.exists(self.file):
            os.makedirs(root, exist_ok=True)
            time.sleep(1.0)  # the transfer
            torch.save((torch.randn(64, 3, 8, 8), torch.randint(0, 10, (64,))), self.file)
        if not os.path.exists(self.file):
            raise RuntimeError("Dataset not found or corrupted. You can use download=True to download it")
        self.x, self.y = torch.load(self.file)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
args = parser.parse_args()
local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("gloo")
root = os.path.join(args.out, "data")
if local_rank == 0:
    trainset = Cifar(root, download=True)
else:
    trainset = Cifar(root)  # expect: file-race
sampler = DistributedSampler(trainset)
model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(192, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in DataLoader(trainset, batch_size=8, sampler=sampler):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
dist.destroy_process_group()
