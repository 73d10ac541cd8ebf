"""A checkpoint saved from the DDP wrapper is loaded into the plain model to fine-tune it.

Source: https://github.com/NVIDIA/DeepLearningExamples/pull/693
Cause, as stated there: PyTorch DDP model checkpoints contain a prefix, which makes the keys
mismatch during loading; the fix strips the prefix on load.
Kind: crash. Family: checkpoint-keys.
Shows on CPU: yes.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def train(model, loader, sampler, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 5, (32,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    path = os.path.join(args.out, "pretrained.pth")
    model = DDP(build())
    train(model, loader, sampler, epochs=1)
    if rank == 0:
        torch.save({"state_dict": model.state_dict()}, path)
    dist.barrier()
    # fine-tuning stage: a fresh network from the saved weights
    fresh = build()
    fresh.load_state_dict(torch.load(path)["state_dict"])  # expect: checkpoint-keys
    train(DDP(fresh), loader, sampler, epochs=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
