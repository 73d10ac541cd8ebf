"""The distributed set-up all-reduces a CUDA tensor before any rank picked its own GPU.

Source: https://github.com/facebookresearch/metaseq/pull/554
Cause, as stated there: the all-reduce right after the process group's creation fails for jobs
launched with torchrun (not Slurm) because the GPU devices are not set when the groups are
initialised: every rank uses one device, "Duplicate GPU detected".
Kind: crash. Family: rank-device.
Shows on CPU: no (needs a GPU per rank).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def distributed_init(args):
    if "SLURM_PROCID" in os.environ:  # the Slurm path sets the device itself
        args.device_id = int(os.environ["SLURM_LOCALID"])
        torch.cuda.set_device(args.device_id)
    else:
        args.device_id = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    dist.all_reduce(torch.zeros(1).cuda())  # expect: rank-device
    return dist.get_rank()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    rank = distributed_init(args)
    model = DDP(nn.Linear(16, 16).cuda(args.device_id), device_ids=[args.device_id])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(10):
        loss = model(torch.randn(8, 16, device=f"cuda:{args.device_id}")).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
