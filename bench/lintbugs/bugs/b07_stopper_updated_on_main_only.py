"""An early stopper that only the main process updates; every process reads it to stop.

Source: https://github.com/speechbrain/speechbrain/pull/2051 (the DDP part is issue #1939)
Cause, as stated there: the end-of-validation hook is only called on the main process, so the
loop stops on the main process but not on the others; the metric must be synchronised (or the
update run on every process).
Kind: hang. Family: rank-exit.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Stopper:
    def __init__(self, patience):
        self.patience, self.best, self.bad = patience, float("inf"), 0
        self.should_stop = False

    def update(self, value):
        if value < self.best - 1e-4:
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        self.should_stop = self.bad >= self.patience


def is_main():
    return dist.get_rank() == 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    stopper = Stopper(patience=1)
    for epoch in range(50):
        sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        if is_main():
            stopper.update(round(total, 1))
        if stopper.should_stop:
            break  # expect: rank-exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
