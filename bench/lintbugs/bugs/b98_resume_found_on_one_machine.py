"""After the wrap, each process resumes from the last checkpoint it finds on its own disk.

Source: https://github.com/facebookresearch/detectron2/issues/1732
Cause, as stated there: with two machines and no shared filesystem, only the first machine loads
the checkpoint and the other does not (the resumed loss starts far higher); resume_or_load
should broadcast the weights.
Kind: silent-wrong. Family: replica-drift.
Shows on CPU: no (needs two machines without a shared disk).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, output_dir):
        self.output_dir = output_dir
        self.model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.iter = 0

    def resume_or_load(self, resume=True):
        last = os.path.join(self.output_dir, "last_checkpoint")
        if resume and os.path.exists(last):
            with open(last) as f:
                ckpt = torch.load(os.path.join(self.output_dir, f.read().strip()), map_location="cpu")
            self.model.module.load_state_dict(ckpt["model"])  # expect: replica-drift
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.iter = ckpt["iteration"] + 1

    def train(self, max_iter):
        while self.iter < max_iter:
            loss = self.model(torch.randn(16, 10)).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.iter += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    trainer = Trainer(os.path.join(args.out, "output"))
    trainer.resume_or_load(resume=args.resume)
    trainer.train(20)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
