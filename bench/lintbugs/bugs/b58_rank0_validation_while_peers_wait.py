"""Validation runs on rank 0 through the live DDP model while the other ranks wait for its result.

Source: https://github.com/LibreYOLO/libreyolo/pull/594
Cause, as stated there: rank-zero validation forwards through the DistributedDataParallel model,
so rank zero enters DDP's buffer broadcast while every peer waits for the result broadcast: the
validation deadlocks. Validate with the plain module, or on every rank.
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


class Trainer:
    def __init__(self):
        self.rank = dist.get_rank()
        net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
        self.model = DDP(net)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        train = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        self.sampler = DistributedSampler(train)
        self.loader = DataLoader(train, batch_size=8, sampler=self.sampler)
        self.val = TensorDataset(torch.randn(24, 8), torch.randint(0, 3, (24,)))

    def _run_validation(self):
        self.model.eval()
        hits = 0
        with torch.no_grad():
            for x, y in DataLoader(self.val, batch_size=8):
                hits += (self.model(x).argmax(1) == y).sum().item()  # expect: rank-collective
        self.model.train()
        return hits / len(self.val)

    def validate(self):
        result = [self._run_validation() if self.rank == 0 else None]
        dist.broadcast_object_list(result, src=0)
        return result[0]

    def fit(self, epochs=2):
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            for x, y in self.loader:
                loss = nn.functional.cross_entropy(self.model(x), y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            acc = self.validate()
            if self.rank == 0:
                print(f"epoch {epoch} acc {acc:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    Trainer().fit()
    dist.destroy_process_group()
