"""A CIFAR-style dataset class downloads its archive in its constructor, built on every rank.

Source: https://github.com/open-mmlab/mmpretrain/pull/273
Cause, as stated there: when the cifar/mnist data set is not found locally it is downloaded on
all ranks, which wastes bandwidth and causes errors when the storage is shared among ranks; the
fix downloads on rank 0 only.
Kind: crash. Family: file-race.
Shows on CPU: yes.
"""

import argparse
import os
import pathlib
import pickle
import shutil
import tarfile
import urllib.request

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def publish(out):
    """A local stand-in for the data set's server (no network here), made once."""
    server = os.path.join(out, "server")
    archive = os.path.join(server, "batches.tar.gz")
    if not os.path.exists(archive):
        os.makedirs(os.path.join(server, "src"), exist_ok=True)
        with open(os.path.join(server, "src", "data_batch"), "wb") as f:
            pickle.dump({"data": torch.randn(64, 8).numpy(), "labels": list(range(64))}, f)
        with tarfile.open(archive + f".{os.getpid()}", "w:gz") as tar:
            tar.add(os.path.join(server, "src", "data_batch"), arcname="data_batch")
        os.replace(archive + f".{os.getpid()}", archive)
    return pathlib.Path(archive).as_uri()


class SmallCIFAR(Dataset):
    def __init__(self, root, url, download=False):
        self.root = root
        if download and not os.path.exists(os.path.join(root, "data_batch")):
            os.makedirs(root, exist_ok=True)
            tgz = os.path.join(root, "batches.tar.gz")
            with urllib.request.urlopen(url) as src, open(tgz, "wb") as dst:  # expect: file-race
                shutil.copyfileobj(src, dst)
            with tarfile.open(tgz) as tar:
                tar.extractall(root)
        with open(os.path.join(root, "data_batch"), "rb") as f:
            batch = pickle.load(f)
        self.x = torch.as_tensor(batch["data"])
        self.y = torch.tensor(batch["labels"]) % 4

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    url = publish(args.out) if dist.get_rank() == 0 else None
    box = [url]
    dist.broadcast_object_list(box)
    data = SmallCIFAR(os.path.join(args.out, "cifar"), box[0], download=True)
    sampler = DistributedSampler(data)
    model = DDP(nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
