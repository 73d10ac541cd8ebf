import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import Dataset


class VisnorProcrark(nn.Module):
    def __init__(self):
        super().__init__()
        self.laist = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.criocrairaist = nn.Linear(12, 1)

    def forward(self, pabupis):
        fuskat = self.laist(pabupis)
        brepligrair = self.criocrairaist(fuskat)
        return brepligrair


def geweawio(dream, g=None):
    dioren = torch.randn(dream, 6, generator=g)
    zopost = (dioren * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return dioren, zopost


class ZunSi(Dataset):
    def __init__(self, dream, g=None):
        self.x, self.y = geweawio(dream, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, theatreadrea):
        return self.x[theatreadrea], self.y[theatreadrea]
