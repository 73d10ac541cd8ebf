"""Semi-supervised training draws labeled and unlabeled batches with next(); neither
DistributedSampler is ever told the epoch.

Source: https://github.com/kekmodel/FixMatch-pytorch/issues/34
Cause, as stated there (and agreed by the author): with DistributedSampler, set_epoch must be
called before each epoch; train.py never calls it.
Kind: silent-wrong. Family: data-sharding.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(args, labeled_loader, unlabeled_loader, model, optimizer):
    labeled_iter = iter(labeled_loader)
    unlabeled_iter = iter(unlabeled_loader)
    for epoch in range(args.epochs):
        for _ in range(args.eval_step):
            try:
                x, y = next(labeled_iter)
            except StopIteration:
                labeled_iter = iter(labeled_loader)  # expect: data-sharding
                x, y = next(labeled_iter)
            try:
                (u,) = next(unlabeled_iter)
            except StopIteration:
                unlabeled_iter = iter(unlabeled_loader)
                (u,) = next(unlabeled_iter)
            logits = model(torch.cat([x, u]))
            pseudo = logits[len(x):].detach().softmax(-1)
            mask = (pseudo.max(-1).values > 0.6).float()
            loss = nn.functional.cross_entropy(logits[:len(x)], y) + (mask * nn.functional.cross_entropy(logits[len(x):], pseudo.argmax(-1), reduction="none")).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--eval-step", type=int, default=4)
    args = p.parse_args()
    dist.init_process_group("gloo")
    labeled = TensorDataset(torch.randn(32, 10), torch.randint(0, 3, (32,)))
    unlabeled = TensorDataset(torch.randn(64, 10))
    labeled_loader = DataLoader(labeled, batch_size=4, sampler=DistributedSampler(labeled), drop_last=True)
    unlabeled_loader = DataLoader(unlabeled, batch_size=8, sampler=DistributedSampler(unlabeled), drop_last=True)
    model = DDP(nn.Linear(10, 3))
    train(args, labeled_loader, unlabeled_loader, model, torch.optim.SGD(model.parameters(), lr=0.03))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
