"""A distributed evaluation gathers CUDA predictions with no torch.cuda.set_device for the rank.

Source: https://github.com/pytorch/ignite/issues/1307
Cause, as stated there: torch.cuda.set_device("cuda:{local_rank}") is missing, which can lead
to hangs on collective ops like all_gather; adding it solved the issue.
Kind: hang. Family: rank-device.
Shows on CPU: no (needs a GPU per rank).
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
    parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl", init_method="env://")
    world = dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}")
    model = DDP(nn.Linear(10, 2).to(device), device_ids=[local_rank])
    data = TensorDataset(torch.randn(64, 10), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    preds = []
    with torch.no_grad():
        for x, _ in loader:
            preds.append(model(x.to(device)).argmax(1))
    local = torch.cat(preds)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)  # expect: rank-device
    if dist.get_rank() == 0:
        print(torch.cat(gathered).float().mean().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
