"""Control: the device follows the local rank (set_device before the group), the writer is global
rank 0, and the run also works as a plain `python` process."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def setup():
    if "WORLD_SIZE" not in os.environ:
        return 0, 0, 1
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), local_rank, dist.get_world_size()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    rank, local_rank, world = setup()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    if world > 1:
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    sampler = DistributedSampler(data) if world > 1 else None
    loader = DataLoader(data, batch_size=8, sampler=sampler, shuffle=sampler is None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
        if rank == 0:
            plain = model.module if world > 1 else model
            torch.save({"epoch": epoch, "model": plain.state_dict()}, os.path.join(args.out, "checkpoint.pt"))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
