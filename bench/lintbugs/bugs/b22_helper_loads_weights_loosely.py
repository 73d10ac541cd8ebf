"""A helper loads pretrained weights with strict=False; the file came from the DDP wrapper, so no
key matches and the model keeps its random initialisation.

Source: https://github.com/pytorch/examples/issues/1029
Cause, as stated there: load_state_dict(state_dict, strict=False) loaded nothing because every key
carried an extra prefix; the model ran without error but its output was nonsense. Removing the
prefix and strict=False fixed it.
Kind: silent-wrong. Family: checkpoint-keys.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def load_weights(net, path):
    state = torch.load(path, map_location="cpu")
    net.load_state_dict(state, strict=False)  # expect: checkpoint-keys
    return net


def pretrain(out):
    model = DDP(nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6)))
    data = TensorDataset(torch.randn(48, 6))
    sampler = DistributedSampler(data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for (x,) in DataLoader(data, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x).backward()
            opt.step()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), os.path.join(out, "pretrained.pt"))
    dist.barrier()


def finetune(out):
    net = load_weights(nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6)), os.path.join(out, "pretrained.pt"))
    model = DDP(net)
    data = TensorDataset(torch.randn(32, 6), torch.randn(32, 6))
    sampler = DistributedSampler(data)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for (x, y) in DataLoader(data, batch_size=8, sampler=sampler):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    a = p.parse_args()
    dist.init_process_group("gloo")
    pretrain(a.out)
    finetune(a.out)
    dist.destroy_process_group()
