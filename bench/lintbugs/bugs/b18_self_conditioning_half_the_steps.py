"""Self-conditioning: half of the steps skip the projection of the previous prediction.

Source: https://github.com/Yuanhy1997/SeqDiffuSeq/issues/25
Cause, as stated there by the maintainer: the error usually means some parameters of the DDP
model are not included in the forward computation; if they are excluded on purpose, pass
find_unused_parameters=True.
Kind: crash. Family: unused-params.
"""

import argparse
import random

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Denoiser(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.self_cond_proj = nn.Linear(dim, dim)
        self.body = nn.Sequential(nn.Linear(dim, 64), nn.SiLU(), nn.Linear(64, dim))

    def forward(self, z, prev=None):
        if prev is not None:
            z = z + self.self_cond_proj(prev)
        return self.body(z)


def step(model, z, target):
    prev = None
    if random.random() < 0.5:
        with torch.no_grad():
            prev = model(z).detach()
    return nn.functional.mse_loss(model(z, prev), target)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    random.seed(0)
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 16))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(Denoiser())  # expect: unused-params
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for z, target in loader:
            loss = step(model, z, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
