"""Correct DDP script that updates parameters by hand (no optimizer): verify counts backward passes."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():  # more ranks than GPUs (verify --share-gpus): they share them, over gloo
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl" if int(os.environ["LOCAL_WORLD_SIZE"]) <= torch.cuda.device_count() else "gloo")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = nn.Linear(4, 1).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    for epoch in range(4):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
