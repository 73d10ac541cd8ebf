"""A metric's all_gather runs inside the validation loop, and the ranks have different numbers
of validation batches.

Source: https://github.com/Project-MONAI/MONAI/issues/5357
Cause, as stated there by the maintainer: aggregate() all-gathers across ranks, so calling it
inside the loop freezes the run when not all ranks run the same number of iterations (the
validation set does not divide evenly); aggregate once, after the loop.
Kind: hang. Family: uneven-batches.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset


class Volumes(Dataset):
    """This rank's volumes: the list is split by hand, the last rank gets the remainder."""

    def __init__(self, n, rank, world):
        per = n // world
        self.ids = list(range(rank * per, n if rank == world - 1 else (rank + 1) * per))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.ids[i])
        return torch.randn(8, generator=g), torch.randint(0, 2, (8,), generator=g).float()


class Dice:
    def __init__(self):
        self.scores = []

    def __call__(self, pred, target):
        inter = (pred * target).sum()
        self.scores.append(2 * inter / (pred.sum() + target.sum() + 1e-6))

    def aggregate(self):
        local = torch.stack(self.scores).mean().reshape(1)
        out = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(out, local)
        return torch.cat(out).mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    train = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32, 8)).float())
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=4, sampler=sampler)
    val_loader = DataLoader(Volumes(11, rank, world), batch_size=1)
    model = DDP(nn.Linear(8, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    dice = Dice()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            for i, (x, y) in enumerate(val_loader):
                dice((model.module(x) > 0).float(), y)
                current = dice.aggregate().item()  # expect: uneven-batches
                if rank == 0:
                    print("val iter", i, "dice so far", current)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
