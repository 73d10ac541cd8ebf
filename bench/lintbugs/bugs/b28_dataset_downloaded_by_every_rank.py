"""Every rank downloads the data set into the same folder at once.

Source: https://github.com/pytorch/tutorials/issues/3065
Cause, as stated there: the data set gets corrupted because all ranks download it simultaneously
(the log shows every rank downloading the same file); download on one rank first.
Kind: crash (corrupted or truncated data). Family: file-race.
"""

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


def mirror(out):
    """A local stand-in for the data set's server (no network here)."""
    server = os.path.join(out, "server")
    os.makedirs(server, exist_ok=True)
    src = os.path.join(server, "train-images.gz")
    if not os.path.exists(src):
        tmp = src + f".{os.getpid()}"
        with gzip.open(tmp, "wb") as f:
            f.write(torch.randn(256, 16).numpy().tobytes())
        os.replace(tmp, src)
    return pathlib.Path(src).as_uri()


def get_dataset(root, url):
    os.makedirs(root, exist_ok=True)
    target = os.path.join(root, "train-images.gz")
    urllib.request.urlretrieve(url, target)  # expect: file-race
    with gzip.open(target, "rb") as f:
        rows = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(-1, 16)
    return TensorDataset(rows[:, :15], rows[:, 15:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    url = mirror(args.out)
    dataset = get_dataset(os.path.join(args.out, "data"), url)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = DDP(nn.Linear(15, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
