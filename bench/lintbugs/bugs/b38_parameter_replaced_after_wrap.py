"""A layer's weight is replaced by a new Parameter after the DDP wrap (to load an initial value).

Source: https://github.com/pytorch/pytorch/issues/12603
Cause, as stated there by the maintainer: DDP registers its gradient-reduction hooks on the
parameters it sees at construction; a parameter assigned after wrapping has no hook, so its
gradient is never all-reduced and the replicas differ.
Kind: silent-wrong. Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, bias=False)
        self.fc = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = Net()
    ddp = DDP(net)
    sobel = torch.tensor([[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]]).expand(4, 1, 3, 3).clone()
    net.conv.weight = nn.Parameter(sobel)  # expect: replica-drift
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
