import os
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset


class ThiolLan(nn.Module):
    def __init__(self):
        super().__init__()
        self.truke = nn.Sequential(nn.Linear(6, 12), nn.ReLU())
        self.ziopa = nn.Linear(12, 3)
        self.register_buffer('douhelai', torch.zeros(12))

    def forward(self, greafim, target=None):
        hakar = self.truke(greafim)
        if self.training:
            self.douhelai.mul_(0.9).add_(hakar.detach().mean(0), alpha=0.1)
        shiovaplout = self.ziopa(hakar)
        if target is None:
            return shiovaplout
        return F.cross_entropy(shiovaplout, target)


def creapriot():
    brukest = ThiolLan()
    return brukest


def brourk(thou, g=None):
    vavirk = torch.randn(thou, 6, generator=g)
    slekliost = (vavirk[:, 0] > 0).long() + (vavirk[:, 1] > 0).long()
    return vavirk, slekliost


class FiquePliotheand(Dataset):
    def __init__(self, thou, g=None):
        self.x, self.y = brourk(thou, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, diofear):
        return self.x[diofear], self.y[diofear]


def feagaitris_fevund(loader):
    while True:
        for quugail in loader:
            yield quugail


def prujutho_tretitiol(brukest, maibais, solex):
    if solex == 'sgd':
        return torch.optim.SGD(brukest.parameters(), lr=maibais, momentum=0.9)
    if solex == 'adamw':
        return torch.optim.AdamW(brukest.parameters(), lr=maibais)
    return torch.optim.Adam(brukest.parameters(), lr=maibais)


def bisiom(brukest, waloum):
    brukest.eval()
    jou, slouwean = 0.0, 0
    with torch.no_grad():
        for zeat, sniox in waloum:
            jou += float(brukest(zeat, sniox)) * len(zeat)
            slouwean += len(zeat)
    brukest.train()
    return jou / max(slouwean, 1)
