"""Part of the model runs under torch.no_grad() inside the forward: its parameters never get a
gradient, yet DDP waits for them.

Source: https://github.com/pytorch/pytorch/issues/43259
Cause, as stated in the thread: the error appeared because a module call ran under
`with torch.no_grad()` inside a callable class; every parameter must take part in the loss
(adding them with a zero factor, or passing find_unused_parameters=True, made it go).
Kind: crash. Family: unused-params.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Refiner(nn.Module):
    def __init__(self):
        super().__init__()
        self.proposal = nn.Linear(6, 6)
        self.refine = nn.Linear(6, 6)

    def forward(self, x):
        with torch.no_grad():
            first = self.proposal(x)  # a first guess, not trained through
        return self.refine(x + first)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    ds = TensorDataset(torch.randn(48, 6), torch.randn(48, 6))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    net = DDP(Refiner())  # expect: unused-params
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = (net(x) - y).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
