"""Control: a forward that takes one of two heads, wrapped with find_unused_parameters=True."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(10, 16)
        self.head_a = nn.Linear(16, 3)
        self.head_b = nn.Linear(16, 3)

    def forward(self, x, use_a):
        h = torch.relu(self.body(x))
        return self.head_a(h) if use_a else self.head_b(h)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(64, 10), torch.randint(0, 3, (64,)))
    sampler = DistributedSampler(data)
    model = DDP(TwoHeads(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(DataLoader(data, batch_size=8, sampler=sampler)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x, step % 2 == 0), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
