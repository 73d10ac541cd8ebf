"""Each process takes GPU dist.get_rank() % device_count() instead of its LOCAL_RANK.

Source: https://github.com/xdit-project/xDiT/pull/731
Cause, as stated there: set_device() used torch.distributed.get_rank() % device_count() instead
of the local rank; it works by coincidence in most set-ups, but on 2 nodes with 8 visible GPUs
and --nproc_per_node=4, node 1's global ranks 4..7 pick GPUs 4..7 while their LOCAL_RANK is 0..3.
Kind: crash. Family: rank-device.
Shows on CPU: no (needs GPUs on two nodes).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def init_distributed_environment():
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())  # expect: rank-device
    return torch.device("cuda", torch.cuda.current_device())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    device = init_distributed_environment()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    model = DDP(nn.Linear(32, 32).to(device), device_ids=[device.index])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(10):
        x = torch.randn(4, 32, device=device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        print("local rank", local_rank, "device", device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
