"""Control: the checkpoint holds the plain module's state (no prefix), resumed strictly into the
plain model before the wrap; an old checkpoint with the prefix is stripped first."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 5))


def train(path, epochs, resume):
    net = build()
    start = 0
    if resume and os.path.exists(path):
        state = torch.load(path, map_location="cpu")
        consume_prefix_in_state_dict_if_present(state["model"], "module.")
        net.load_state_dict(state["model"])
        start = state["epoch"]
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 5, (64,)))
    sampler = DistributedSampler(data)
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if dist.get_rank() == 0:
            torch.save({"epoch": epoch + 1, "model": model.module.state_dict()}, path)
        dist.barrier()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    dist.init_process_group("gloo")
    path = os.path.join(args.out, "last.pt")
    train(path, 2, resume=False)
    train(path, 4, resume=True)
    dist.destroy_process_group()
