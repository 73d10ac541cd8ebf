"""A wrong conversion of eval_single.py: the end-of-epoch evaluation went under the rank-0 guard
with the log line, and it still runs the DDP model, whose first forward broadcasts its BatchNorm
buffers from rank 0 while the other ranks wait in the barrier after the guard: the ranks enter
different collectives."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def evaluate(model, loader):
    model.eval()
    hits = 0
    with torch.no_grad():
        for x, y in loader:
            hits += (model(x).argmax(1) == y).sum().item()
    model.train()
    return hits / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain python: a world of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()

    torch.manual_seed(0)
    # 48 batches: 24 a rank on two ranks, more than the 20 steps verify once stopped at
    train = TensorDataset(torch.randn(384, 8), torch.randint(0, 3, (384,)))
    val = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    sampler = DistributedSampler(train, shuffle=True)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            acc = evaluate(ddp_model, DataLoader(val, batch_size=8))
            print(f"epoch {epoch} val acc {acc:.3f}")
            torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
        dist.barrier()  # the others wait for rank 0's evaluation and checkpoint
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
