"""Control: the ranks' shards differ in size and the training loop runs under DDP's Join context
manager, which shadows the collectives of ranks that ran out of data."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--out", default=".")
p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
rows = torch.randn(40 + 16 * rank, 5)
loader = DataLoader(TensorDataset(rows[:, :4], rows[:, 4:]), batch_size=8, shuffle=True)
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Join([model]):
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
dist.destroy_process_group()
