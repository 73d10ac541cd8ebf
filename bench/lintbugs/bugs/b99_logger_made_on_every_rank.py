"""train() builds its wandb logger with no rank test: every rank starts a run of its own.

Source: https://github.com/Emerge-Lab/PufferDrive/pull/468
Cause, as stated there: logger creation in train() was ungated, so under torchrun every rank
called wandb.init(), giving world_size duplicate runs in the same group; only rank 0 should
build the logger.
Kind: silent-wrong. Family: file-race.
Shows on CPU: no (needs wandb).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import wandb
from torch.nn.parallel import DistributedDataParallel as DDP


def train(args):
    rank = dist.get_rank()
    logger = wandb.init(project="drive", group="ddp", config=vars(args))  # expect: file-race
    policy = DDP(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 2)))
    opt = torch.optim.Adam(policy.parameters(), lr=3e-4)
    for global_step in range(args.steps):
        obs = torch.randn(32, 6)
        loss = policy(obs).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        logger.log({"loss": loss.item(), "rank": rank}, step=global_step)
    logger.finish()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    train(args)
    dist.destroy_process_group()
