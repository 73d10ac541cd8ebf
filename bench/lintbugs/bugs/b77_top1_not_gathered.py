"""Top-1 accuracy is computed over this process's validation shard and printed by the master.

Source: https://github.com/Lyken17/Efficient-PyTorch/issues/24
Cause, as stated there: in the DDP usage the metric acc1 is not gathered from the different
machines.
Kind: silent-wrong. Family: metric-one-shard.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value, n):
        self.sum += value * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def validate(loader, model):
    top1 = AverageMeter()
    model.eval()
    with torch.no_grad():
        for images, target in loader:
            acc1 = (model(images).argmax(1) == target).float().mean().item() * 100
            top1.update(acc1, images.size(0))
    model.train()
    return top1.avg


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    val = TensorDataset(torch.randn(48, 8), torch.randint(0, 3, (48,)))
    sampler = DistributedSampler(train)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for images, target in DataLoader(train, batch_size=8, sampler=sampler):
            loss = nn.functional.cross_entropy(model(images), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc1 = validate(val_loader, model)
        if dist.get_rank() == 0:
            print(f" * Acc@1 {acc1:.3f}")  # expect: metric-one-shard
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
