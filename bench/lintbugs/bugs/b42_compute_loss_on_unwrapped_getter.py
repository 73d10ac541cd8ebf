"""A curriculum trainer computes the loss through a getter that returns the module inside the
DDP wrapper.

Source: https://github.com/OpenTSLM/OpenTSLM/pull/49
Cause, as stated there: the loss is computed on the unwrapped module (`_get_model()` returns
self.model.module), so DDP's reducer never fires, gradients are never synchronised, and each
rank trains an independent replica on its own 1/N of the data.
Kind: silent-wrong. Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class SeriesModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.GRU(3, 16, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, series):
        out, _ = self.encoder(series)
        return self.head(out[:, -1])

    def compute_loss(self, batch):
        series, target = batch
        return nn.functional.mse_loss(self(series), target)


class CurriculumTrainer:
    def __init__(self):
        self.model = DDP(SeriesModel())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def _get_model(self):
        return self.model.module if isinstance(self.model, DDP) else self.model

    def train_stage(self, loader, sampler, epochs):
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                loss = self._get_model().compute_loss(batch)  # expect: replica-drift
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(64, 10, 3), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    CurriculumTrainer().train_stage(DataLoader(data, batch_size=8, sampler=sampler), sampler, 2)
    dist.destroy_process_group()
