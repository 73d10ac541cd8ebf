"""The training loss that is logged is rank 0's own micro-batch loss, never averaged over ranks.

Source: https://github.com/KellerJordan/modded-nanogpt/issues/2
Cause, as stated there (agreed by the author): gradients are averaged by the DDP backward, but the
logged loss is not; logging the exact loss needs a torch.distributed.all_reduce of it.
Kind: silent-wrong (the logged figure is one shard's). Family: metric-one-shard.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
args = parser.parse_args()
dist.init_process_group(backend="gloo")
ddp_rank = int(os.environ["RANK"])
master_process = ddp_rank == 0

tokens = torch.randint(0, 50, (2, 1 + 8 * 4 * 12))
model = DDP(nn.Sequential(nn.Embedding(50, 24), nn.Linear(24, 50)))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
logfile = os.path.join(args.out, "train_log.txt")

for step in range(12):
    buf = tokens[ddp_rank, step * 32:(step + 1) * 32 + 1]
    x, y = buf[:-1].view(4, 8), buf[1:].view(4, 8)
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if master_process:
        with open(logfile, "a") as f:
            f.write(f"s:{step} trl:{loss.item():.4f}\n")  # expect: metric-one-shard

dist.destroy_process_group()
