"""Bug: every rank saves the same checkpoint (verify: rank0-writes)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    rank = int(os.environ.get("RANK", 0))
    if torch.cuda.is_available():  # more ranks than GPUs (verify --share-gpus): they share them, over gloo
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl" if int(os.environ["LOCAL_WORLD_SIZE"]) <= torch.cuda.device_count() else "gloo")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        # BUG: not guarded by `if rank == 0:`, so every rank writes the same file
        torch.save(model.module.state_dict(), os.path.join(args.out, "checkpoint.pt"))
        if rank == 0: print(f"epoch {epoch} loss {loss.item():.4f}")  # noqa: E701  (the log is rank 0's alone)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
