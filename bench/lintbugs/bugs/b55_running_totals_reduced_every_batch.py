"""The running metric totals are all-reduced after every validation batch: each all_reduce adds
the other ranks' running totals again, so the totals grow geometrically.

Source: https://github.com/facebookresearch/fairchem/pull/75
Cause, as stated there: an AllReduce on the metrics in each iteration means the counts and sums
are updated to add up all of the previous values, increasing them exponentially with DDP (Inf
metrics); all-reduce only once, at the end of validation.
Kind: silent-wrong. Family: metric-one-shard.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Evaluator:
    def __init__(self):
        self.metrics = {"mae_total": torch.zeros(1), "numel": torch.zeros(1)}

    def update(self, pred, target):
        self.metrics["mae_total"] += (pred - target).abs().sum()
        self.metrics["numel"] += target.numel()
        for value in self.metrics.values():
            dist.all_reduce(value)  # expect: metric-one-shard

    def result(self):
        return (self.metrics["mae_total"] / self.metrics["numel"]).item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    train = TensorDataset(torch.randn(64, 5), torch.randn(64, 3))
    val = TensorDataset(torch.randn(32, 5), torch.randn(32, 3))
    sampler = DistributedSampler(train)
    model = DDP(nn.Linear(5, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(train, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.l1_loss(model(x), y).backward()
            opt.step()
        evaluator = Evaluator()
        with torch.no_grad():
            for x, y in DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False)):
                evaluator.update(model(x), y)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} val mae {evaluator.result():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
