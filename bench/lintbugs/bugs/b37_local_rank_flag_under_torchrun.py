"""The script takes its local rank from a --local_rank flag with default -1 and starts the process
group only when the flag is set; torchrun passes no flag.

Source: https://github.com/wz0919/ScaleVLN/issues/13
Cause, as stated there (torch's own message, quoted in the issue): torchrun sets the local rank in
os.environ['LOCAL_RANK'] and passes no --local-rank argument; a script that expects the
argument must read the variable instead (and torch.distributed.launch now passes --local-rank,
which this parser rejects: "unrecognized arguments: --local-rank=0").
Kind: silent-wrong (under torchrun each process trains alone on all the data). Family: rank-device.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.add_argument("--local_rank", type=int, default=-1)  # expect: rank-device
parser.add_argument("--train_batch_size", type=int, default=8)
opts = parser.parse_args()

distributed = opts.local_rank != -1
if distributed:
    dist.init_process_group("gloo")
model = nn.Sequential(nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3))
if distributed:
    model = DDP(model)
data = TensorDataset(torch.randn(64, 12), torch.randint(0, 3, (64,)))
sampler = DistributedSampler(data) if distributed else None
loader = DataLoader(data, batch_size=opts.train_batch_size, sampler=sampler, shuffle=sampler is None)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
if distributed:
    dist.destroy_process_group()
