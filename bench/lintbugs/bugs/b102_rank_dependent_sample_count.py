"""Each rank builds its own samples from its node's records, so the loaders' lengths differ by rank.

Source: https://github.com/mosaicml/composer/issues/3415
Cause, as stated there: a dataloader workflow produced a variable number of samples depending on
the rank; with DDP the number of batches then differs per rank (100 on rank 0, 120 on rank 1)
and the ranks time out in the all_reduce calls of the training and evaluation loops.
Kind: hang. Family: uneven-batches.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def records_for(rank):
    g = torch.Generator().manual_seed(100 + rank)
    count = 40 + 12 * rank  # this node's share of the raw records
    return torch.randn(count, 6, generator=g), torch.randn(count, 1, generator=g)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x, y = records_for(rank)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)  # expect: uneven-batches
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        seen = torch.zeros(1)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(xb)
        dist.all_reduce(seen)
        if rank == 0:
            print(f"epoch {epoch}: {int(seen.item())} samples")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
