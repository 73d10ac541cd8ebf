"""Control: rank 0 downloads the data, the other ranks wait at a barrier, then every rank reads it."""

import argparse
import gzip
import os
import pathlib
import urllib.request

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def server_file(out):
    src = os.path.join(out, "server", "rows.gz")
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(src), exist_ok=True)
        with gzip.open(src, "wb") as f:
            f.write(torch.randn(128, 9).numpy().tobytes())
    dist.barrier()
    return pathlib.Path(src).as_uri()


def load_rows(root, url):
    target = os.path.join(root, "rows.gz")
    if dist.get_rank() == 0:
        os.makedirs(root, exist_ok=True)
        urllib.request.urlretrieve(url, target)
    dist.barrier()
    with gzip.open(target, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(-1, 9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rows = load_rows(os.path.join(args.out, "data"), server_file(args.out))
    data = TensorDataset(rows[:, :8], rows[:, 8:])
    sampler = DistributedSampler(data)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=16, sampler=sampler):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
