"""Correct DDP script that logs a sample image per epoch through a tracker (which writes it to a
temporary folder of its own) and saves a checkpoint per epoch and a final model, all on rank 0.
The tracker's files are not the script's outputs, and the final save (after the loop, not reached
in one epoch) has nothing to do with them (verify --epochs 1: all pass)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tracker_lib import log_image


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            log_image(f"sample_{epoch}.png", bytes(16))
            torch.save(model.module.state_dict(), os.path.join(args.out, f"epoch_{epoch}.pt"))
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
