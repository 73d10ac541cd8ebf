"""The DDP trainer's AMP step clips the gradients while the GradScaler still scales them.

Source: https://github.com/pytorch/examples/issues/1196
Cause, as stated there: per the GradScaler documentation, scaler.unscale_(optimizer) must come
before clip_grad_norm_ whenever the gradients are modified or inspected; the trainer clips
without it.
Kind: silent-wrong. Family: mixed-precision.
Shows on CPU: no (the GradScaler scales on CUDA only).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, loader, grad_norm_clip=1.0, use_amp=True):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = DDP(model.to(self.local_rank), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.loader, self.grad_norm_clip, self.use_amp = loader, grad_norm_clip, use_amp
        self.scaler = torch.amp.GradScaler("cuda", enabled=use_amp)

    def _run_batch(self, source, targets):
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.use_amp):
            loss = nn.functional.cross_entropy(self.model(source), targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_norm_clip)  # expect: mixed-precision
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item()

    def train(self, epochs):
        for epoch in range(epochs):
            self.loader.sampler.set_epoch(epoch)
            for x, y in self.loader:
                self._run_batch(x.to(self.local_rank), y.to(self.local_rank))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    data = TensorDataset(torch.randn(256, 32), torch.randint(0, 8, (256,)))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    Trainer(nn.Linear(32, 8), loader).train(2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
