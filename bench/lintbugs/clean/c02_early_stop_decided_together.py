"""Control: early stopping on the validation loss averaged over every rank, so all ranks stop at
the same epoch."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Trainer:
    def __init__(self, patience=2):
        self.model = DDP(nn.Linear(6, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
        val = TensorDataset(torch.randn(32, 6), torch.randn(32, 1))
        self.sampler = DistributedSampler(data)
        self.loader = DataLoader(data, batch_size=8, sampler=self.sampler)
        self.val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
        self.patience, self.best, self.bad = patience, float("inf"), 0

    def val_loss(self):
        total = torch.zeros(2)
        with torch.no_grad():
            for x, y in self.val_loader:
                total += torch.tensor([nn.functional.mse_loss(self.model.module(x), y, reduction="sum").item(), len(y)])
        dist.all_reduce(total)
        return (total[0] / total[1]).item()

    def fit(self, epochs=20):
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            for x, y in self.loader:
                self.opt.zero_grad()
                nn.functional.mse_loss(self.model(x), y).backward()
                self.opt.step()
            loss = self.val_loss()
            if loss < self.best - 1e-3:
                self.best, self.bad = loss, 0
            else:
                self.bad += 1
            if self.bad >= self.patience:
                break


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    Trainer().fit()
    dist.destroy_process_group()
