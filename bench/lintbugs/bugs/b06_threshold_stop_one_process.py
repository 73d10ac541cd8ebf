"""Training stops when this process's validation accuracy crosses a threshold.

Source: https://github.com/Lightning-AI/pytorch-lightning/issues/379
Cause, as stated there: when the stop condition is met in one or more processes but not in all,
those processes stop while the others keep running, and the training hangs.
Kind: hang. Family: rank-exit.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def evaluate(model, loader):
    hits = total = 0
    with torch.no_grad():
        for x, y in loader:
            hits += (model(x).argmax(-1) == y).sum().item()
            total += y.numel()
    return hits / total


def train(threshold, epochs=6):
    torch.manual_seed(0)
    x = torch.randn(96, 10)
    y = (x[:, 0] > 0).long()
    y[65::2] = torch.randint(0, 2, (16,))  # half of the validation labels are noise
    train_set, val_set = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=8, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))
    model = DDP(nn.Linear(10, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        val_acc = evaluate(model.module, val_loader)
        if val_acc > threshold:
            return epoch  # expect: rank-exit
    return epochs


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    stopped = train(args.threshold)
    dist.barrier()
    dist.destroy_process_group()
