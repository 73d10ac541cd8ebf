"""The epoch summary divides this rank's summed loss by its own batch count, and rank 0 logs it.

Source: https://github.com/NVIDIA/physicsnemo/pull/1754
Cause, as stated there: avg_loss = total_loss / n is a sum over batches that never gets summed
across ranks, with n the local number of batches, so the logged train/val loss reflects only
rank 0's shard of the data, not the global average.
Kind: silent-wrong. Family: metric-one-shard.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def run_epoch(model, loader, opt=None):
    total_loss, n = 0.0, 0
    for x, y in loader:
        with torch.set_grad_enabled(opt is not None):
            loss = nn.functional.mse_loss(model(x), y)
        if opt is not None:
            opt.zero_grad()
            loss.backward()
            opt.step()
        total_loss += loss.item()
        n += 1
    return total_loss / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    val = TensorDataset(torch.randn(32, 4) * (1 + torch.arange(32).unsqueeze(1) / 8), torch.randn(32, 1))
    train_sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=8, sampler=train_sampler)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        train_loss = run_epoch(model, train_loader, opt)
        val_loss = run_epoch(model, val_loader)
        if rank == 0:
            print(f"epoch {epoch} train {train_loss:.4f} val {val_loss:.4f}")  # expect: metric-one-shard
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
