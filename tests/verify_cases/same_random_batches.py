"""Bug: batches drawn with torch.randint in a get_batch() and no per-rank seed. torch's default
generator starts alike in every process, so every rank draws the same batches (verify: data-sharding)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(1337)
data = torch.randint(0, 16, (2000,))
block, batch = 8, 4


def get_batch():
    ix = torch.randint(len(data) - block, (batch,))  # BUG: the same offsets on every rank
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + block + 1] for i in ix])
    return x, y


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" and int(os.environ["LOCAL_WORLD_SIZE"]) <= torch.cuda.device_count() else "gloo")
    model = nn.Sequential(nn.Embedding(16, 16), nn.Linear(16, 16)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(12):
        x, y = get_batch()
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x).view(-1, 16), y.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
