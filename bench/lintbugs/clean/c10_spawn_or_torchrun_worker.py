"""Control: one worker function for mp.spawn (index = local rank) and for torchrun; the device
comes from the local rank, the writer is global rank 0."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def worker(local_rank, args):
    if "RANK" not in os.environ:  # mp.spawn on one node
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("gloo", rank=local_rank, world_size=args.nprocs)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    model = DDP(nn.Linear(8, 2).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--nprocs", type=int, default=2)
    args = p.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(int(os.environ["LOCAL_RANK"]), args)
    else:
        mp.spawn(worker, args=(args,), nprocs=args.nprocs)
