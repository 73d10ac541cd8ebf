"""Each rank reads its own data file; the files hold different numbers of samples.

Source: https://github.com/pytorch/pytorch/issues/33148
Cause, as stated there: DDP instances that process more input batches hang, because the peer with
the fewest batches does not join the additional all-reduce operations (the Join context manager
was added for this).
Kind: hang. Family: uneven-batches.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()

# stand-in for the per-worker files of a sharded corpus: part-0 has 40 rows, part-1 has 56
part = os.path.join(args.out, f"part-{rank}.pt")
torch.save(torch.randn(40 + 16 * rank, 5), part)

rows = torch.load(part)
loader = DataLoader(TensorDataset(rows[:, :4], rows[:, 4:]), batch_size=8, shuffle=True)
model = DDP(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for epoch in range(2):
    for x, y in loader:  # expect: uneven-batches
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

dist.destroy_process_group()
