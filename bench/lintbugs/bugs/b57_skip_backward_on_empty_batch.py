"""A micro-batch with no usable item is skipped, on the rank that drew it, before its backward.

Source: https://github.com/NVIDIA-NeMo/Automodel/pull/2468
Cause, as stated there: the loop caught the per-rank "no valid anchor" case with a `continue`
that skips the backward, whose gradient all-reduce the other ranks still run: the collectives
mismatch (a hang) or the optimizer-step counts drift apart across ranks.
Kind: hang. Family: rank-collective.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    feats = torch.randn(64, 6)
    lengths = torch.randint(1, 6, (64,))  # an item needs length 5 to give a training pair
    data = TensorDataset(feats, lengths)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, length in loader:
            usable = length >= 5
            if not usable.any():
                continue  # expect: rank-collective
            loss = model(x[usable]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
