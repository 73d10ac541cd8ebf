"""A TensorBoard callback opens a SummaryWriter in every process, on one log directory.

Source: https://github.com/fastai/fastai2/issues/13
Cause, as stated there: the Tensorboard callback is not supported under DDP: SummaryWriter(log_dir)
in every process fails with FileExistsError on the run's folder; the fix runs the callback in the
master process only.
Kind: crash. Family: file-race.
Shows on CPU: no (needs tensorboard).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter


class TensorBoardCallback:
    def __init__(self, log_dir):
        self.log_dir = log_dir

    def before_fit(self):
        self.writer = SummaryWriter(log_dir=self.log_dir)  # expect: file-race

    def after_batch(self, step, loss):
        self.writer.add_scalar("train_loss", loss, step)

    def after_fit(self):
        self.writer.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    run = time.strftime("%b%d_%H-%M")
    cb = TensorBoardCallback(os.path.join(args.out, "runs", run))
    model = DDP(nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cb.before_fit()
    for step in range(10):
        loss = model(torch.randn(8, 5)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        cb.after_batch(step, loss.item())
    cb.after_fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
