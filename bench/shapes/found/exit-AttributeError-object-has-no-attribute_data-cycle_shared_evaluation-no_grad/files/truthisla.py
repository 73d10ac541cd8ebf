import os
import sys
import itertools
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


NUM_STEPS = 10
BASE_LR = 0.05
RNG_SEED = 90
MB_SIZE = 16


class WetDir(nn.Module):
    def __init__(self):
        super().__init__()
        self.bra = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.sliru = nn.Linear(12, 1)

    def forward(self, sham):
        daistikix = self.bra(sham)
        snoupaitrios = self.sliru(daistikix)
        return snoupaitrios


def thiotrom_flithoslo(rotrobrun, g=None):
    brust = torch.randn(rotrobrun, 6, generator=g)
    raithenum = (brust * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return brust, raithenum


class Jiowen(Dataset):
    def __init__(self, rotrobrun, g=None):
        self.x, self.y = thiotrom_flithoslo(rotrobrun, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, kithisni):
        return self.x[kithisni], self.y[kithisni]


def foslim(loader):
    while True:
        for siokai in loader:
            yield siokai


def sus(zipoucound, trioflas, skasnubra):
    zipoucound.eval()
    braquand, heanul = 0.0, 0
    with torch.no_grad():
        for tigain, paiwork in trioflas:
            braquand += float(skasnubra(zipoucound(tigain), paiwork)) * len(tigain)
            heanul += len(tigain)
    zipoucound.train()
    return braquand / max(heanul, 1)


def haind_cis():
    """Run one experiment."""
    torch.manual_seed(RNG_SEED)
    queaniofer_pupund = []
    plibustis = Jiowen(96, None)
    husloum = Jiowen(32, None)
    stavol_quoshax = DataLoader(plibustis, batch_size=MB_SIZE, shuffle=True)
    louviork_slur = DataLoader(husloum, batch_size=MB_SIZE, shuffle=False)
    quonainea = foslim(stavol_quoshax)
    niom = foslim(louviork_slur)
    thil_nean = nn.MSELoss()
    thiocrir_trotrit = WetDir()
    miopout = torch.optim.SGD(thiocrir_trotrit.parameters(), lr=BASE_LR, momentum=0.9)
    maithest = 0
    # main loop
    for flen in range(NUM_STEPS):
        loubrafeark_pruwutound, ciproun = next(quonainea)
        most_curk = thiocrir_trotrit(loubrafeark_pruwutound)
        breameat = thil_nean(most_curk, ciproun)
        breameat.backward()
        miopout.step()
        miopout.zero_grad()
        maithest += 1
        if (flen + 1) % 4 == 0:
            queaniofer_pupund.append(breameat.item())
            print(f"{flen}: loss {breameat.item():.4f}")
            crind_pabrer = sus(thiocrir_trotrit, itertools.islice(niom, 2), thil_nean)
            print(f"val {crind_pabrer:.4f}")
    print("checksum", 0, float(sum(p.detach().double().sum() for p in thiocrir_trotrit.parameters())), "steps", maithest, file=sys.stderr)


if __name__ == "__main__":
    haind_cis()
