"""The validation set is evaluated over a DistributedSampler and its accuracy counted as is.

Source: https://github.com/pytorch/pytorch/issues/22584
Cause, as stated there: the validation-set evaluation gave different results according to the
number of processes: DistributedSampler repeats some samples to make the dataset evenly
divisible, and the repeats are counted.
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


def validation_set_eval(model, loader):
    correct = torch.zeros(2)
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            correct[0] += (model(x).argmax(1) == y).sum()
            correct[1] += len(y)
    dist.all_reduce(correct)
    model.train()
    return (correct[0] / correct[1]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 6), torch.randint(0, 2, (64,)))
    valid = TensorDataset(torch.randn(25, 6), torch.randint(0, 2, (25,)))  # 25 does not divide by the ranks
    train_sampler = DistributedSampler(train)
    valid_loader = DataLoader(valid, batch_size=5, sampler=DistributedSampler(valid, shuffle=False))  # expect: metric-one-shard
    model = DDP(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        for x, y in DataLoader(train, batch_size=8, sampler=train_sampler):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc = validation_set_eval(model, valid_loader)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} val acc {acc:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
