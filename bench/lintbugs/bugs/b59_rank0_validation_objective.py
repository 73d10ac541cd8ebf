"""Only rank 0 builds the validation loader and computes the validation objective each epoch.

Source: https://github.com/kaldi-asr/kaldi/issues/4346
Cause, as stated there: rank 0 needs the validation dataloader and the other ranks do not; the
job hangs in train_one_epoch -> get_validation_objf -> get_objf -> criterion, on rank 0.
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


def get_objf(model, x, y):
    return nn.functional.mse_loss(model(x), y)


def get_validation_objf(model, loader):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += get_objf(model, x, y).item()  # expect: rank-collective
    return total / len(loader)


def train_one_epoch(model, opt, loader, valid_loader, rank):
    for x, y in loader:
        loss = get_objf(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print("valid objf", get_validation_objf(model, valid_loader))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 5), torch.randn(64, 1))
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    valid_loader = None
    if rank == 0:
        valid_loader = DataLoader(TensorDataset(torch.randn(16, 5), torch.randn(16, 1)), batch_size=8)
    model = DDP(nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        train_one_epoch(model, opt, loader, valid_loader, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
