"""A trainer loads a checkpoint written during DDP training into its plain model (the
prediction path does not wrap it).

Source: https://github.com/facebookresearch/fairchem/pull/76
Cause, as stated there: a model trained with DDP has "module." keys in its checkpoint; loading it
into the non-DDP model needs the prefix removed (the fix strips the first 7 characters of each key).
Kind: crash. Family: checkpoint-keys.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ForcesTrainer:
    def __init__(self, out, distributed=True):
        self.out = out
        self.model = nn.Sequential(nn.Linear(3, 32), nn.SiLU(), nn.Linear(32, 3))
        if distributed:
            self.model = DistributedDataParallel(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def save(self, path):
        if dist.get_rank() == 0:
            torch.save({"state_dict": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path)

    def load_checkpoint(self, path):
        checkpoint = torch.load(path, map_location="cpu")
        self.model.load_state_dict(checkpoint["state_dict"])  # expect: checkpoint-keys

    def train(self, epochs=2):
        data = TensorDataset(torch.randn(64, 3), torch.randn(64, 3))
        sampler = DistributedSampler(data)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for pos, forces in DataLoader(data, batch_size=8, sampler=sampler):
                self.optimizer.zero_grad()
                nn.functional.l1_loss(self.model(pos), forces).backward()
                self.optimizer.step()
        self.save(os.path.join(self.out, "checkpoint.pt"))
        dist.barrier()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    dist.init_process_group("gloo")
    ForcesTrainer(args.out).train()
    predictor = ForcesTrainer(args.out, distributed=False)
    predictor.load_checkpoint(os.path.join(args.out, "checkpoint.pt"))
    dist.destroy_process_group()
