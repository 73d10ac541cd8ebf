"""The trainer's load() restores model, optimizer and EMA with torch.load(str(path)) on each process.

Source: https://github.com/lucidrains/imagen-pytorch/pull/132
Cause, as stated there: torch.load(str(path)) loads the state dict to the default device,
'cuda:0', for each process, which is extra GPU memory use on cuda:0; load to the CPU first.
Kind: silent-wrong (memory on GPU 0). Family: checkpoint-device.
Shows on CPU: no (needs a GPU per rank).
"""

import argparse
import copy
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class DiffusionTrainer:
    def __init__(self, unet, lr=1e-4):
        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        self.unet = unet.to(self.device)
        self.ema_unet = copy.deepcopy(self.unet)
        self.optim = torch.optim.Adam(self.unet.parameters(), lr=lr)
        self.ddp_unet = DDP(self.unet, device_ids=[self.device.index])

    def save(self, path):
        torch.save({"model": self.unet.state_dict(), "ema": self.ema_unet.state_dict(),
                    "optim": self.optim.state_dict()}, str(path))

    def load(self, path):
        path = Path(path)
        loaded_obj = torch.load(str(path))  # expect: checkpoint-device
        self.unet.load_state_dict(loaded_obj["model"])
        self.ema_unet.load_state_dict(loaded_obj["ema"])
        self.optim.load_state_dict(loaded_obj["optim"])

    def step(self, images):
        noise = torch.randn_like(images)
        loss = nn.functional.mse_loss(self.ddp_unet(images + noise), noise)
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    trainer = DiffusionTrainer(nn.Conv2d(3, 3, 3, padding=1))
    if args.resume:
        trainer.load(args.resume)
    for _ in range(10):
        trainer.step(torch.randn(4, 3, 16, 16, device=trainer.device))
    if dist.get_rank() == 0:
        trainer.save(Path(args.out) / "imagen.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
