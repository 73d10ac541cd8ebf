"""Resuming with strict=False: the wrapper's "module." keys match nothing in the plain model, and
nothing is loaded, without an error.

Source: https://github.com/nayeemrizve/OpenLDN/issues/5
Cause, as stated there: the saved state dict's keys carry the "module." prefix the model does not
expect; the reporter passed strict=False to get past the error, which loads none of the weights
(pytorch/examples#1029 describes the same silent failure).
Kind: silent-wrong. Family: checkpoint-keys.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()

data = TensorDataset(torch.randn(64, 8), torch.randint(0, 5, (64,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=8, sampler=sampler)
resume = os.path.join(args.out, "checkpoint.pth.tar")


def run(epochs, start_epoch=0, state=None):
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 5))
    if state is not None:
        net.load_state_dict(state["state_dict"], strict=False)  # expect: checkpoint-keys
        start_epoch = state["epoch"]
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if rank == 0:
            torch.save({"epoch": epoch + 1, "state_dict": model.state_dict()}, resume)
        dist.barrier()
    return model


run(args.epochs)
# the job is restarted from its last checkpoint for two more epochs
state = torch.load(resume, map_location="cpu")
run(args.epochs + 2, state=state)
dist.destroy_process_group()
