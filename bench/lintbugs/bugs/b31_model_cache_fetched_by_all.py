"""Model weights are fetched into a shared cache by every rank of the job.

Source: https://github.com/NVIDIA/earth2mip/issues/91
Cause, as stated there: the model data is downloaded by all ranks of a parallel job at once,
which corrupts the files when they are not in the model registry yet.
Kind: crash (corrupted files). Family: file-race.
"""

import argparse
import os
import pathlib
import shutil
import urllib.request

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Registry:
    def __init__(self, cache):
        self.cache = cache

    def fetch(self, name, url):
        path = os.path.join(self.cache, name)
        if not os.path.exists(path):
            os.makedirs(self.cache, exist_ok=True)
            with urllib.request.urlopen(url) as src, open(path, "wb") as dst:  # expect: file-race
                shutil.copyfileobj(src, dst)
        return path


def publish(out):
    """Stand-in for the remote package store."""
    src = os.path.join(out, "store", "fcn.pt")
    os.makedirs(os.path.dirname(src), exist_ok=True)
    if dist.get_rank() == 0:
        torch.save(nn.Linear(8, 8).state_dict(), src)
    dist.barrier()
    return pathlib.Path(src).as_uri()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    dist.init_process_group("gloo")
    url = publish(args.out)
    path = Registry(os.path.join(args.out, "cache")).fetch("fcn.pt", url)
    model = nn.Linear(8, 8)
    model.load_state_dict(torch.load(path))
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        x = torch.randn(4, 8)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
