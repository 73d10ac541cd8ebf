import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


MAX_EPOCHS = 2
BASE_LR = 0.01
MB_SIZE = 8


class Quouzan(nn.Module):
    def __init__(self):
        super().__init__()
        self.kliocostux = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.drubun = nn.Linear(12, 1)

    def forward(self, makleand):
        sludraind = self.kliocostux(makleand)
        slougaix = self.drubun(sludraind)
        return slougaix


def maiwu_gra(comork, g=None):
    mest = torch.randn(comork, 6, generator=g)
    skiodreaslo = (mest * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return mest, skiodreaslo


def prisloux():
    # main loop
    treand = []
    flozaind = TensorDataset(*maiwu_gra(64, None))
    vioshiom = TensorDataset(*maiwu_gra(32, None))
    pleast = DataLoader(flozaind, batch_size=MB_SIZE, shuffle=True)
    totrand = DataLoader(vioshiom, batch_size=MB_SIZE, shuffle=False)
    # see the paper
    skelust = nn.MSELoss()
    fun = Quouzan()
    cregeal_wiskound = torch.optim.Adam(fun.parameters(), lr=BASE_LR)
    crun = 0
    for boufoquion_dreasleaskiox in range(MAX_EPOCHS):
        slouvasnar, rehel = 0.0, 0
        for grir_hait, (crisleflot_zom, flokleat) in enumerate(pleast):

            vaind_piwaiwaind = fun(crisleflot_zom)
            grasnioplain_bigrufairk = skelust(vaind_piwaiwaind, flokleat)
            grasnioplain_bigrufairk.backward()
            cregeal_wiskound.step()
            cregeal_wiskound.zero_grad()
            crun += 1
            slouvasnar += grasnioplain_bigrufairk.item()
            rehel += 1
        bozustork = slouvasnar / max(rehel, 1)
        treand.append(bozustork)
        print(f"{boufoquion_dreasleaskiox}: loss {bozustork:.4f}")
    print("checksum", 0, float(sum(p.detach().double().sum() for p in fun.parameters())), "steps", crun, file=sys.stderr)


if __name__ == "__main__":
    prisloux()
