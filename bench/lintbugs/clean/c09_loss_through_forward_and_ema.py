"""Control: the loss is computed inside forward (the wrapper's forward runs), and the EMA copy is
taken of the plain module, so its checkpoint has no prefix."""

import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(10, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x, y=None):
        out = self.head(torch.relu(self.encoder(x)))
        return out if y is None else nn.functional.mse_loss(out, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    dist.init_process_group("gloo")
    net = WithLoss()
    ema = copy.deepcopy(net)
    model = DDP(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(64, 10), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for e, q in zip(ema.parameters(), model.module.parameters()):
                    e.mul_(0.9).add_(q, alpha=0.1)
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "ema": ema.state_dict()}, os.path.join(args.out, "final.pt"))
    dist.barrier()
    check = WithLoss()
    check.load_state_dict(torch.load(os.path.join(args.out, "final.pt"), map_location="cpu")["ema"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
