"""Bug: single.py "converted" with a rank-0 guard that is never true: RANK is a string (verify: saved)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
RANK = os.environ.get("RANK", 0)  # BUG: a string under torchrun, so RANK == 0 is never true
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
LOCAL_DEVICE = torch.device("cuda", LOCAL_RANK % torch.cuda.device_count()) if torch.cuda.is_available() else torch.device("cpu")


def ddp_setup():
    if torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_DEVICE)
    backend = "nccl" if torch.cuda.is_available() and int(os.environ.get("LOCAL_WORLD_SIZE", 1)) <= torch.cuda.device_count() else "gloo"
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, device_id=LOCAL_DEVICE if backend == "nccl" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def main():
    ddp_setup()
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    device = LOCAL_DEVICE

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    loader = DataLoader(data, batch_size=4, shuffle=False, sampler=DistributedSampler(data, shuffle=True))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    model = DDP(model, device_ids=[LOCAL_DEVICE.index] if torch.cuda.is_available() else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if RANK == 0:
            torch.save(model.module.state_dict(), os.path.join(args.out, "checkpoint.pt"))
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
