"""Gradient clipping all-reduces the squared gradient norm over the data-parallel group, after DDP.

Source: https://github.com/modelscope/twinkle/pull/290
Cause, as stated there: pure DDP backward already synchronizes complete gradients on every rank;
passing the data-parallel group into gradient clipping sums their squared norms again, so with
two ranks a norm of 0.8 is reported as 1.131 and wrongly clipped.
Kind: silent-wrong. Family: double-reduce.
Shows on CPU: no (every rank clips alike: the ranks stay equal, only the clipping is wrong).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def clip_grad_norm(parameters, max_norm, group=None):
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.pow(2).sum() for g in grads]).sum()
    if group is not None:
        dist.all_reduce(total, group=group)  # expect: double-reduce
    total_norm = total.sqrt()
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return total_norm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    dp_group = dist.new_group(list(range(dist.get_world_size())))
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            norm = clip_grad_norm(model.parameters(), 1.0, group=dp_group)
            opt.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} grad norm {norm.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
