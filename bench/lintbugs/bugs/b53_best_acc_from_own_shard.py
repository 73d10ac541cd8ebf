"""validate() returns each process's own accuracy; rank 0 keeps its own as best_acc1 and
decides which checkpoint is the best.

Source: https://github.com/pytorch/examples/issues/905
Cause, as stated there: the validate function returns different values for each process when
using DDP; the results should be combined across all GPUs.
Kind: silent-wrong. Family: metric-one-shard.
"""

import argparse
import os
import shutil

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def validate(val_loader, model):
    model.eval()
    top1, n = 0.0, 0
    with torch.no_grad():
        for images, target in val_loader:
            output = model(images)
            top1 += (output.argmax(1) == target).float().sum().item()
            n += images.size(0)
    model.train()
    return 100.0 * top1 / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train = TensorDataset(torch.randn(64, 3, 4, 4), torch.randint(0, 5, (64,)))
    val = TensorDataset(torch.randn(32, 3, 4, 4), torch.randint(0, 5, (32,)))
    train_sampler = DistributedSampler(train)
    train_loader = DataLoader(train, batch_size=8, sampler=train_sampler)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(48, 5)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    best_acc1 = 0.0
    for epoch in range(3):
        train_sampler.set_epoch(epoch)
        for images, target in train_loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images), target).backward()
            optimizer.step()
        acc1 = validate(val_loader, model)
        is_best = acc1 > best_acc1  # expect: metric-one-shard
        best_acc1 = max(acc1, best_acc1)
        if rank == 0:
            path = os.path.join(args.out, "checkpoint.pth.tar")
            torch.save({"epoch": epoch + 1, "state_dict": model.module.state_dict(), "best_acc1": best_acc1}, path)
            if is_best:
                shutil.copyfile(path, os.path.join(args.out, "model_best.pth.tar"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
