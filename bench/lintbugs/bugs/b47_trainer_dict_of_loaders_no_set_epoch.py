"""A vocoder trainer keeps its loaders in a dict and loops over epochs without setting the
sampler's epoch.

Source: https://github.com/kan-bayashi/ParallelWaveGAN/issues/177
Cause, as stated there: in distributed mode, calling set_epoch(epoch) at the beginning of each
epoch, before creating the DataLoader iterator, is necessary for shuffling to work across
epochs; it is missing (confirmed and labelled a bug by the maintainer).
Kind: silent-wrong. Family: data-sharding.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, steps, data_loader, model, optimizer):
        self.steps = 0
        self.max_steps = steps
        self.data_loader = data_loader
        self.model = model
        self.optimizer = optimizer
        self.epochs = 0
        self.finish_train = False

    def run(self):
        while True:
            self._train_epoch()  # expect: data-sharding
            if self.finish_train:
                break

    def _train_epoch(self):
        for batch in self.data_loader["train"]:
            self._train_step(batch)
            if self.steps >= self.max_steps:
                self.finish_train = True
                return
        self.epochs += 1

    def _train_step(self, batch):
        mel, audio = batch
        loss = nn.functional.l1_loss(self.model["generator"](mel), audio)
        self.optimizer["generator"].zero_grad()
        loss.backward()
        self.optimizer["generator"].step()
        self.steps += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    train_set = TensorDataset(torch.randn(48, 20), torch.randn(48, 80))
    sampler = {"train": DistributedSampler(train_set, shuffle=True)}
    data_loader = {"train": DataLoader(train_set, batch_size=6, sampler=sampler["train"], shuffle=False)}
    generator = DistributedDataParallel(nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 80)))
    model = {"generator": generator}
    optimizer = {"generator": torch.optim.Adam(generator.parameters(), lr=1e-3)}
    Trainer(12, data_loader, model, optimizer).run()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
