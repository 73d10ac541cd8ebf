"""On the first run every process fetches the data files into the shared data folder.

Source: https://github.com/aidecentralized/sonar/issues/101
Cause, as stated there: for the first run each process on each machine tries to download the
data set, which can corrupt it; only one process per machine should download it.
Kind: crash. Family: file-race.
Shows on CPU: yes.
"""

import argparse
import os
import urllib.request
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FILES = ("features.npy", "targets.npy")


def fake_remote(out):
    remote = Path(out) / "remote"
    remote.mkdir(parents=True, exist_ok=True)
    for name, rows in zip(FILES, (np.random.rand(80, 5), np.random.rand(80, 1))):
        target = remote / name
        if not target.exists():
            np.save(str(target) + f".{os.getpid()}.npy", rows.astype("float32"))
            os.replace(str(target) + f".{os.getpid()}.npy", target)
    return remote.as_uri()


def ensure_data(data_dir, base_url):
    os.makedirs(data_dir, exist_ok=True)
    for name in FILES:
        path = os.path.join(data_dir, name)
        if not os.path.exists(path):
            urllib.request.urlretrieve(f"{base_url}/{name}", path)  # expect: file-race
    return TensorDataset(*(torch.from_numpy(np.load(os.path.join(data_dir, n))) for n in FILES))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    data = ensure_data(os.path.join(args.out, "data"), fake_remote(args.out))
    sampler = DistributedSampler(data)
    model = DDP(nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=10, sampler=sampler):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
