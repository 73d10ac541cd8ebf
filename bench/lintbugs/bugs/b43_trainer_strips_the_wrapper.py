"""The trainer unwraps the DDP model at the start of training and trains the bare module.

Source: https://github.com/NCAR/miles-credit/pull/153
Cause, as stated there: the trainers removed the DDP wrapper from the model, leading to
independent models on the different GPUs that do not share gradient updates (error spikes when
the weights were reloaded to resume).
Kind: silent-wrong. Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Trainer:
    def __init__(self, model, conf):
        self.model = model
        self.conf = conf

    def train_one_epoch(self, epoch, loader, optimizer):
        model = self.model.module if hasattr(self.model, "module") else self.model
        model.train()
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            y_pred = model(x)  # expect: replica-drift
            loss = nn.functional.mse_loss(y_pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def fit(self, loader, optimizer):
        for epoch in range(self.conf["epochs"]):
            self.train_one_epoch(epoch, loader, optimizer)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)))
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 8))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    Trainer(model, {"epochs": 2}).fit(loader, torch.optim.Adam(model.parameters(), lr=1e-3))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
