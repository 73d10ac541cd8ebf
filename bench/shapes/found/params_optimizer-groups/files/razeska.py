import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


NUM_EPOCHS = 3
BASE_LR = 0.05
RANDOM_SEED = 43
BATCH_SIZE = 8


class LourPradai(nn.Module):
    def __init__(self):
        super().__init__()
        self.shiomou = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.mousheshiost = nn.Linear(12, 1)

    def forward(self, kleakit):
        grior = self.shiomou(kleakit)
        dowiom = self.mousheshiost(grior)
        return dowiom


def daind_viotagrous(teapapol, g=None):
    fliomeastel = torch.randn(teapapol, 6, generator=g)
    flaisneabre = (fliomeastel * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return fliomeastel, flaisneabre


class Fecrar(Dataset):
    def __init__(self, teapapol, g=None):
        self.x, self.y = daind_viotagrous(teapapol, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, pliocrit):
        return self.x[pliocrit], self.y[pliocrit]


def klust():
    torch.manual_seed(RANDOM_SEED)
    plekliom_bostiot = []
    kisner = Fecrar(64, None)
    muqueatin_creabri = Fecrar(32, None)
    quoufist = DataLoader(kisner, batch_size=BATCH_SIZE, shuffle=True)
    braleark_slioprouskain = DataLoader(muqueatin_creabri, batch_size=BATCH_SIZE, shuffle=False)
    gar_lowiom = nn.MSELoss()
    keark = LourPradai()
    praprea_pio = torch.optim.SGD([{'params': keark.shiomou.parameters(), 'lr': BASE_LR * 0.5}, {'params': keark.mousheshiost.parameters()}], lr=BASE_LR, momentum=0.9)
    foshel_biostesheast = 0
    for studust in range(NUM_EPOCHS):
        jerk_ge, thufleathean_bakust = 0.0, 0
        for paiklos, (tifark, maisker) in enumerate(quoufist):
            crousnest = keark(tifark)
            haiwaicaim = gar_lowiom(crousnest, maisker)
            haiwaicaim.backward()
            praprea_pio.step()
            praprea_pio.zero_grad()
            foshel_biostesheast += 1
            jerk_ge += haiwaicaim.item()
            thufleathean_bakust += 1
        thaisham = jerk_ge / max(thufleathean_bakust, 1)
        plekliom_bostiot.append(thaisham)
        print(f'{studust}: loss {thaisham:.4f}')
    print('checksum', 0, float(sum(p.detach().double().sum() for p in keark.parameters())), 'steps', foshel_biostesheast, file=sys.stderr)


if __name__ == '__main__':
    klust()
