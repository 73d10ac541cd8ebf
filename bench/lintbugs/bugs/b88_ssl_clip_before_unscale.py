"""A semi-supervised trainer clips gradients after the scaled backward, before any unscaling.

Source: https://github.com/TorchSSL/TorchSSL/pull/59
Cause, as stated there: in automatic mixed precision all gradients must be unscaled before they
are clipped (PyTorch's AMP examples); the trainer clipped the scaled ones.
Kind: silent-wrong. Family: mixed-precision.
Shows on CPU: no (the GradScaler scales on CUDA only).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def train_step(model, optimizer, scaler, x_lb, y_lb, x_ulb, clip):
    with torch.autocast("cuda"):
        logits_lb = model(x_lb)
        with torch.no_grad():
            pseudo = model(x_ulb).softmax(-1).argmax(-1)
        logits_ulb = model(x_ulb + 0.1 * torch.randn_like(x_ulb))
        loss = nn.functional.cross_entropy(logits_lb, y_lb) + nn.functional.cross_entropy(logits_ulb, pseudo)
    scaler.scale(loss).backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # expect: mixed-precision
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.detach()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl")
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10)).cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    scaler = torch.cuda.amp.GradScaler()
    for _ in range(20):
        x_lb, y_lb = torch.randn(16, 20).cuda(gpu), torch.randint(0, 10, (16,)).cuda(gpu)
        train_step(model, optimizer, scaler, x_lb, y_lb, torch.randn(32, 20).cuda(gpu), args.clip)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
