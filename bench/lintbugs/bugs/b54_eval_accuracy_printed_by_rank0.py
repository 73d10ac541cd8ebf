"""Distributed evaluation: each process scores its shard and rank 0 prints its own accuracy as
the result.

Source: https://github.com/intel/ai-reference-models/pull/134
Cause, as stated there: the evaluation accuracy should be synchronised across all processes with
the all_reduce interface, so that every process shows the same (whole data set) result.
Kind: silent-wrong. Family: metric-one-shard.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()

torch.manual_seed(0)
x = torch.randn(96, 8)
y = (x.sum(1) > 0).long()
train_set, eval_set = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
train_sampler = DistributedSampler(train_set)
model = DDP(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.2)
for epoch in range(2):
    train_sampler.set_epoch(epoch)
    for xb, yb in DataLoader(train_set, batch_size=8, sampler=train_sampler):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

eval_loader = DataLoader(eval_set, batch_size=8, sampler=DistributedSampler(eval_set, shuffle=False))
correct = total = 0
model.eval()
with torch.no_grad():
    for xb, yb in eval_loader:
        correct += (model(xb).argmax(-1) == yb).sum().item()
        total += yb.size(0)
accuracy = correct / total
if rank == 0:
    print(f"Top-1 accuracy: {accuracy:.4f}")  # expect: metric-one-shard
dist.destroy_process_group()
