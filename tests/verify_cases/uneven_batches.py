"""Bug: the ranks get different numbers of batches (9 vs 7) from a hand-made split (verify: even-batches, ranks).

Rank 1 runs out of batches first and goes on to the epoch's metric all-reduce while rank 0 is
still in a DDP gradient all-reduce: the collectives no longer match.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():  # more ranks than GPUs (verify --share-gpus): they share them, over gloo
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl" if int(os.environ["LOCAL_WORLD_SIZE"]) <= torch.cuda.device_count() else "gloo")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    # BUG: a hand-made split by a ratio instead of DistributedSampler: 36 samples (9 batches)
    # for rank 0, 28 (7 batches) for rank 1.
    cut = 36 if world > 1 else 64
    part = range(0, cut) if rank == 0 else range(cut, 64)
    loader = DataLoader(Subset(data, list(part)), batch_size=4, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=device)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {(total[0] / total[1]).item():.4f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
