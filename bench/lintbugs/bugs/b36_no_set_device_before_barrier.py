"""The trainer moves the model to its GPU id but never calls torch.cuda.set_device: NCCL's
barrier and the collectives guess GPU 0.

Source: https://github.com/pytorch/examples/pull/1142
Cause, as stated there: the recommended practice to avoid hangs and high memory use on GPU 0 is to
call set_device(i), which switches the default device from GPU 0 to GPU i (the PR adds it to
every DDP example, minGPT-ddp's ddp_setup included).
Kind: hang / memory on GPU 0 (NCCL only). Family: rank-device.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def ddp_setup():
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")  # expect: rank-device


class Trainer:
    def __init__(self, model, loader, optimizer):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.gpu_id) if torch.cuda.is_available() else torch.device("cpu")
        self.model = DDP(model.to(self.device), device_ids=[self.gpu_id] if torch.cuda.is_available() else None)
        self.loader = loader
        self.optimizer = optimizer

    def _run_epoch(self, epoch):
        self.loader.sampler.set_epoch(epoch)
        for source, targets in self.loader:
            source, targets = source.to(self.device), targets.to(self.device)
            self.optimizer.zero_grad()
            nn.functional.cross_entropy(self.model(source), targets).backward()
            self.optimizer.step()

    def train(self, epochs):
        for epoch in range(epochs):
            self._run_epoch(epoch)
            dist.barrier()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    ddp_setup()
    data = TensorDataset(torch.randn(64, 20), torch.randint(0, 4, (64,)))
    model = nn.Linear(20, 4)
    loader = DataLoader(data, batch_size=8, shuffle=False, sampler=DistributedSampler(data))
    Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1)).train(2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
