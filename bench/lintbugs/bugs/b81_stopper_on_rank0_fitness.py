"""Early stopping is decided from the fitness rank 0 computes in its own validation.

Source: https://github.com/ultralytics/yolov5/pull/4576
Cause, as stated there: EarlyStopping works on a single GPU but not under DDP: the `stop`
variable is not broadcast from RANK 0 to the other ranks, so the train loop breaks only on
RANK 0 and the training hangs.
Kind: hang. Family: rank-exit.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class EarlyStopping:
    def __init__(self, patience=1):
        self.best_fitness, self.best_epoch, self.patience = 0.0, 0, patience

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        return epoch - self.best_epoch >= self.patience


def fitness_of(model, loader):
    with torch.no_grad():
        hits = sum((model(x).argmax(1) == y).sum().item() for x, y in loader)
    return hits / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    RANK = dist.get_rank()
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
    val_loader = DataLoader(TensorDataset(torch.randn(30, 6), torch.randint(0, 3, (30,))), batch_size=10)
    sampler = DistributedSampler(train)
    model = DDP(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    stopper, stop = EarlyStopping(), False
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(train, batch_size=8, sampler=sampler):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if RANK in (-1, 0):
            fi = fitness_of(model.module, val_loader)
            stop = stopper(epoch=epoch, fitness=fi)
        if stop:
            break  # expect: rank-exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
