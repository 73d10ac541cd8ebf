"""The DDP model is moved off its device and back (to free memory for another task) in the
middle of training.

Source: https://github.com/pytorch/pytorch/issues/104336
Cause, as stated there: after moving a DDP-wrapped model CUDA -> CPU -> CUDA, backward() no longer
triggers the gradient reduction, so the model is effectively trained on each device alone,
without any warning.
Kind: silent-wrong. Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def build_index(model):
    """Uses the memory the model held for something else (a retrieval index, say)."""
    return torch.randn(128, 10)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    device = torch.device("cuda", dist.get_rank()) if torch.cuda.is_available() else torch.device("cpu")
    ddp_model = DDP(ToyModel().to(device))
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 10), torch.randn(64, 5))
    sampler = DistributedSampler(data)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.mse_loss(ddp_model(x.to(device)), y.to(device)).backward()
            opt.step()
        ddp_model.to(torch.float64)
        build_index(ddp_model)
        ddp_model.to(torch.float32)  # expect: replica-drift
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
