"""train.py pins one GPU as the default device for debugging, then launches every rank on it.

Source: https://github.com/Peterande/D-FINE/issues/289
Cause, as stated there: "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device"; the
reporter had set a default video card for the device in train.py while debugging, and that one
card served every rank.
Kind: crash. Family: rank-device.
Shows on CPU: no (needs a GPU per rank).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.cuda.set_device(1)  # expect: rank-device


def setup():
    dist.init_process_group("nccl")
    return int(os.environ["LOCAL_RANK"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    setup()
    device = torch.device("cuda")
    model = DDP(nn.Conv2d(3, 8, 3).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(5):
        out = model(torch.randn(2, 3, 32, 32, device=device))
        loss = out.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
