"""The checkpoint is saved where local_rank == 0: once per node, into one shared path.

Source: https://github.com/NVIDIA/apex/issues/886
Cause, as stated there: saving when local_rank == 0 has one process per node write to the same
location, which corrupts the checkpoint when there is more than one node ("storage has wrong
size"); the writer must also be on the master node (global rank 0).
Kind: crash (corrupted checkpoint on multi-node runs). Family: writer-local-rank.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
args = parser.parse_args()

dist.init_process_group(backend="gloo", init_method="env://")
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(64, 32), torch.randint(0, 8, (64,)))
sampler = DistributedSampler(data)
best_prec1 = 0.0

for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in DataLoader(data, batch_size=8, sampler=sampler):
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    if args.local_rank == 0:
        torch.save({"epoch": epoch + 1, "state_dict": model.module.state_dict(), "best_prec1": best_prec1},  # expect: writer-local-rank
                   os.path.join(args.out, "checkpoint.pth.tar"))

dist.destroy_process_group()
