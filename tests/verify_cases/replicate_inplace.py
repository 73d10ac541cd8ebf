"""Correct DDP applied in place with torch's composable replicate(): one model object, its class
renamed DDP<Name>, its state_dict keys the plain model's; an EMA copy updated on every rank and
saved with the model each epoch."""

import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import replicate
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = Net()
    ema = copy.deepcopy(model)
    replicate(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.lerp_(p, 0.1)
        if rank == 0:
            torch.save({"model": model.state_dict(), "ema": ema.state_dict()}, os.path.join(args.out, "ckpt.pt"))
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
