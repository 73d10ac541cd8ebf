"""A GAN resumes generator and discriminator from --ckpt loaded with no map_location.

Source: https://github.com/rosinality/stylegan2-pytorch/issues/36
Cause, as stated there: resuming training from a checkpoint takes up memory on the primary GPU
under distributed training; torch.load(args.ckpt, map_location=lambda storage, loc: storage)
avoids it.
Kind: silent-wrong (memory on GPU 0). Family: checkpoint-device.
Shows on CPU: no (needs a GPU per rank).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--iter", type=int, default=20)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = "cuda"
    generator = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32)).to(device)
    discriminator = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to(device)
    g_optim = torch.optim.Adam(generator.parameters(), lr=2e-4)
    d_optim = torch.optim.Adam(discriminator.parameters(), lr=2e-4)
    start_iter = 0
    if args.ckpt is not None:
        ckpt = torch.load(args.ckpt)  # expect: checkpoint-device
        generator.load_state_dict(ckpt["g"])
        discriminator.load_state_dict(ckpt["d"])
        g_optim.load_state_dict(ckpt["g_optim"])
        d_optim.load_state_dict(ckpt["d_optim"])
        start_iter = ckpt["iter"]
    generator = DDP(generator, device_ids=[local_rank])
    discriminator = DDP(discriminator, device_ids=[local_rank])
    for i in range(start_iter, args.iter):
        real = torch.randn(8, 32, device=device)
        fake = generator(torch.randn(8, 16, device=device))
        d_loss = nn.functional.softplus(discriminator(fake.detach())).mean() + nn.functional.softplus(-discriminator(real)).mean()
        d_optim.zero_grad()
        d_loss.backward()
        d_optim.step()
        g_loss = nn.functional.softplus(-discriminator(fake)).mean()
        g_optim.zero_grad()
        g_loss.backward()
        g_optim.step()
    if dist.get_rank() == 0:
        torch.save({"g": generator.module.state_dict(), "d": discriminator.module.state_dict(),
                    "g_optim": g_optim.state_dict(), "d_optim": d_optim.state_dict(), "iter": args.iter},
                   os.path.join(args.out, "gan.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
