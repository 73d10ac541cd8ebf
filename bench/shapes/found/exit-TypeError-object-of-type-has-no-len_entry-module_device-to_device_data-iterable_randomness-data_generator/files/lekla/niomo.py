import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import Dataset, IterableDataset


class QuesheandCriolain(nn.Module):
    def __init__(self):
        super().__init__()
        self.pizirk = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.keanea = nn.Linear(12, 1)

    def forward(self, riotraimex):
        crekles = self.pizirk(riotraimex)
        quioflat = self.keanea(crekles)
        return quioflat


def quair(grio, g=None):
    shathouthoux = torch.randn(grio, 6, generator=g)
    snoulo = (shathouthoux * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return shathouthoux, snoulo


class GatotZiogour(Dataset):
    def __init__(self, grio, g=None):
        self.x, self.y = quair(grio, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, noplain):
        return self.x[noplain], self.y[noplain]


class TroustQuoprex(IterableDataset):
    def __init__(self, grio, g=None):
        self.x, self.y = quair(grio, g)

    def __iter__(self):
        for noplain in range(len(self.x)):
            yield self.x[noplain], self.y[noplain]
