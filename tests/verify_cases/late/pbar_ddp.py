"""A wrong conversion of pbar_single.py: the progress bar is disabled on the other ranks, and they
still divide by its counter, which a disabled bar never advances (ZeroDivisionError at the end of
the first epoch, on rank 1)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm


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
    data = TensorDataset(torch.randn(384, 8), torch.randint(0, 3, (384,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        pbar = tqdm(loader, desc=f"epoch {epoch}", disable=rank != 0)
        total = 0.0
        for x, y in pbar:
            loss = nn.functional.cross_entropy(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        epoch_loss = total / pbar.n
        scheduler.step(epoch_loss)
        if rank == 0:
            print(f"epoch {epoch} mean loss {epoch_loss:.4f}")
            torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
