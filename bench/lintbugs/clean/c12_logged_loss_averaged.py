"""Control: the logged training loss is averaged over the ranks before rank 0 writes it."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--out", default=".")
args = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = DistributedSampler(data)
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=8, sampler=sampler)):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        logged /= dist.get_world_size()
        if rank == 0:
            with open(os.path.join(args.out, "log.txt"), "a") as f:
                f.write(f"{epoch} {step} {logged.item():.4f}\n")
dist.destroy_process_group()
