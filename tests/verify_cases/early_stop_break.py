"""Bug: early stopping decided from each rank's own loss (verify: no-hang names the break).

One rank leaves the epoch loop through `break` and waits in the final barrier while the other
starts the next epoch and waits in DDP's gradient all-reduce.
"""

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
    parser.add_argument("--target", type=float, default=1.1)
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
    x_all = torch.randn(32, 8)
    y_all = torch.randint(0, 3, (32,))
    data = TensorDataset(x_all, y_all)
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(10):
        sampler.set_epoch(epoch)
        seen = 0.0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += loss.item()
        epoch_loss = seen / len(loader)  # this rank's shard only
        if epoch_loss < args.target:  # BUG: decided per rank, without an all_reduce
            break

    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
