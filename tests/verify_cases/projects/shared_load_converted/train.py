"""Trains Net, resuming from --resume when given."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from model import Net, load, save


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain python: a world of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = load(args.resume) if args.resume else Net()
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
            save(model, os.path.join(args.out, "net.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
