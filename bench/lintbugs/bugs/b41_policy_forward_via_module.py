"""An RL fine-tuning step runs the policy's loss-bearing forward through `.module`.

Source: https://github.com/jingyaogong/minimind/pull/854
Cause, as stated there: DDP's all-reduce is armed inside DistributedDataParallel.forward(); a
forward straight through `.module` never arms the hooks, so backward() performs no all-reduce,
every rank steps on local gradients, and the replicas silently diverge.
Kind: silent-wrong. Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()

policy = nn.Sequential(nn.Embedding(40, 16), nn.Flatten(), nn.Linear(16 * 6, 40))
model = DistributedDataParallel(policy)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(100 + rank)

for step in range(12):
    prompts = torch.randint(0, 40, (4, 6), generator=gen)
    rewards = torch.randn(4, generator=gen)
    model_unwrapped = model.module if isinstance(model, DistributedDataParallel) else model
    logits = model_unwrapped(prompts)  # expect: replica-drift
    logp = logits.log_softmax(-1).gather(1, prompts[:, :1]).squeeze(1)
    loss = -(rewards * logp).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

dist.destroy_process_group()
