"""The master keeps the best validation loss, and saves the model on it, from its own shard.

Source: https://github.com/cybertronai/transformer-xl/issues/14
Cause, as stated there: the script only stores the best value for the validation loss on the
master machine and ignores the validation loss of the other machines; average the loss (and
perplexity) across machines before using it.
Kind: silent-wrong. Family: metric-one-shard.
Shows on CPU: yes.
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def evaluate(model, loader):
    model.eval()
    total_loss, total_len = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            total_loss += nn.functional.cross_entropy(model(x), y, reduction="sum").item()
            total_len += len(y)
    model.train()
    return total_loss / total_len


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    vocab = 20
    train = TensorDataset(torch.randint(0, vocab, (96, 6)), torch.randint(0, vocab, (96,)))
    valid = TensorDataset(torch.randint(0, vocab, (40, 6)), torch.randint(0, vocab, (40,)))
    sampler = DistributedSampler(train)
    va_loader = DataLoader(valid, batch_size=10, sampler=DistributedSampler(valid, shuffle=False))
    model = DDP(nn.Sequential(nn.Embedding(vocab, 16), nn.Flatten(), nn.Linear(96, vocab)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    best_val_loss = None
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(train, batch_size=12, sampler=sampler):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val_loss = evaluate(model, va_loader)
        if rank == 0:
            print(f"| valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):9.3f}")
            if best_val_loss is None or val_loss < best_val_loss:  # expect: metric-one-shard
                best_val_loss = val_loss
                torch.save(model.module.state_dict(), os.path.join(args.out, "model.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
