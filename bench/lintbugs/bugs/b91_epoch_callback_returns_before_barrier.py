"""An end-of-epoch callback returns early on the other ranks, and on rank 0 without a logger, before its barrier.

Source: https://github.com/talmolab/sleap-nn/pull/437
Cause, as stated there: training froze after each epoch with several GPUs: some callbacks
returned early on non-rank-0 processes (or on rank 0 when the logger was None) without reaching
the barrier that every rank must reach.
Kind: hang. Family: rank-collective.
Shows on CPU: yes.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class VizCallback:
    def __init__(self, out, logger=None):
        self.out, self.logger = out, logger

    def on_train_epoch_end(self, epoch, model):
        if dist.get_rank() != 0:
            return
        with torch.no_grad():
            sample = model.module(torch.linspace(-1, 1, 5).unsqueeze(1))
        with open(os.path.join(self.out, f"viz_{epoch}.txt"), "w") as f:
            f.write(" ".join(f"{v:.3f}" for v in sample.squeeze(1).tolist()))
        dist.barrier()  # expect: rank-collective


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 1), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    model = DDP(nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    callback = VizCallback(args.out)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        callback.on_train_epoch_end(epoch, model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
