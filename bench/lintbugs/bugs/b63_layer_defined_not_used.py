"""A layer is built in __init__ and never called in forward.

Source: https://github.com/ImprintLab/MedSegDiff/issues/27
Cause, as stated there: "Expected to have finished reduction in the prior iteration": a
parameterized layer is defined in the network's __init__ but not used in forward.
Kind: crash. Family: unused-params.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SegNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(1, 8, 3, padding=1)
        self.mid = nn.Conv2d(8, 8, 3, padding=1)
        self.highway = nn.Conv2d(1, 8, 1)  # kept from an earlier version of the network
        self.up = nn.Conv2d(8, 1, 3, padding=1)

    def forward(self, x):
        return self.up(torch.relu(self.mid(torch.relu(self.down(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    images = torch.randn(32, 1, 12, 12)
    masks = (images > 0).float()
    data = TensorDataset(images, masks)
    sampler = DistributedSampler(data)
    net = DDP(SegNet())  # expect: unused-params
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, m in DataLoader(data, batch_size=4, sampler=sampler):
            loss = nn.functional.binary_cross_entropy_with_logits(net(x), m)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
