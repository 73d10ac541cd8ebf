"""Resuming loads the checkpoint without map_location: every process materialises rank 0's
tensors on the GPU they were saved from (GPU 0) before copying them to its own.

Source: https://github.com/pytorch/pytorch/issues/23138
Cause, as stated there: with --resume, GPU 0 holds an extra process for every rank, ~725 MB each,
that stays for the whole run; torch.load needs map_location to the process's own device (or
the CPU).
Kind: silent-wrong (memory on GPU 0; out of memory on larger models). Family: checkpoint-device.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start_epoch = 0
    resume = args.resume or os.path.join(args.out, "checkpoint.pth.tar")
    if os.path.isfile(resume):
        checkpoint = torch.load(resume)  # expect: checkpoint-device
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"]
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    data = TensorDataset(torch.randn(64, 20), torch.randint(0, 10, (64,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for epoch in range(start_epoch, start_epoch + 2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        if dist.get_rank() == 0:
            torch.save({"epoch": epoch + 1, "state_dict": model.module.state_dict(), "optimizer": optimizer.state_dict()}, resume)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
