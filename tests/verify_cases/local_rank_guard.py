"""Bug (shows with several nodes only): the writer guard tests LOCAL_RANK (verify --nnodes 2: rank0-writes)."""

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
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
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

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if local_rank == 0:  # BUG: true on every node's first process, not only on global rank 0
            torch.save(model.module.state_dict(), os.path.join(args.out, "checkpoint.pt"))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
