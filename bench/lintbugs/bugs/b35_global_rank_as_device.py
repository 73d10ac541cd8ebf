"""The device index comes from dist.get_rank(), the global rank.

Source: https://github.com/Red-Hat-AI-Innovation-Team/mini_trainer/pull/33
Cause, as stated there: parts of the code use torch.distributed.get_rank() to get the local rank;
that works on one node but breaks any multi-node job (rank 8 asks for GPU 8 on an 8-GPU node).
Kind: crash (multi-node: invalid device ordinal). Family: rank-device.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def setup_device():
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    local_rank = dist.get_rank()
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # expect: rank-device
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def train(device):
    model = nn.Sequential(nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 24)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(64, 24))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for (x,) in DataLoader(data, batch_size=8, sampler=sampler):
            x = x.to(device)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x).backward()
            opt.step()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    train(setup_device())
    dist.destroy_process_group()
