"""The EMA keeps its shadow weights under the plain model's names, then updates from the wrapper.

Source: https://github.com/m2lines/Samudra/pull/326
Cause, as stated there: the initial EMA was created before the DDP set-up, so its parameter
names did not match the final self.model (the wrapper's `module.` names); the EMA must be made
after the wrap.
Kind: crash. Family: checkpoint-keys.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class ShadowEMA:
    def __init__(self, model, decay=0.99):
        self.decay = decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model):
        for name, p in model.named_parameters():
            self.shadow[name].mul_(self.decay).add_(p, alpha=1 - self.decay)


class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
        self.ema = ShadowEMA(self.model)
        self.model = DDP(self.model)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def step(self, x, y):
        loss = nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.ema.update(self.model)  # expect: checkpoint-keys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    trainer = Trainer()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            trainer.step(x, y)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
