"""Checkpoints and TensorBoard logs are written by every process.

Source: https://github.com/zylo117/Yet-Another-EfficientDet-Pytorch/pull/487
Cause, as stated there by the maintainer reviewing the move to DDP: printing is shown N times
(N = number of GPUs) and TensorBoard is recorded N times; saving and logging must happen on one
process.
Kind: silent-wrong (N writers of one log and checkpoint). Family: file-race.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def save_checkpoint(model, saved_path, name):
    if isinstance(model, DistributedDataParallel):
        torch.save(model.module.state_dict(), os.path.join(saved_path, name))  # expect: file-race
    else:
        torch.save(model.state_dict(), os.path.join(saved_path, name))


def train(opt):
    dist.init_process_group("gloo")
    os.makedirs(opt.saved_path, exist_ok=True)
    log = open(os.path.join(opt.saved_path, "train_log.txt"), "a")
    model = DistributedDataParallel(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)))
    data = TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 2, (32,)))
    sampler = DistributedSampler(data)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for imgs, labels in DataLoader(data, batch_size=4, sampler=sampler):
            loss = nn.functional.cross_entropy(model(imgs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            log.write(f"{step} {loss.item():.4f}\n")
            step += 1
        save_checkpoint(model, opt.saved_path, f"efficientdet-d0_{epoch}_{step}.pth")
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    args.saved_path = os.path.join(args.out, "logs")
    train(args)
