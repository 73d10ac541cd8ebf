import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset
from craiquost_io.lokistust import jakul


EPOCH_COUNT = 2
BASE_LR = 0.05
RNG_SEED = 42
BATCH = 8


class Hamound(nn.Module):
    def __init__(self):
        super().__init__()
        self.zuboucen = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.drioklen = nn.Linear(12, 1)

    def forward(self, naflur):
        pelio = self.zuboucen(naflur)
        sopliork = self.drioklen(pelio)
        return sopliork


def leal(patam, g=None):
    snourioquiork = torch.randn(patam, 6, generator=g)
    vuthehoux = (snourioquiork * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return snourioquiork, vuthehoux


class CoslorkCriburk(Dataset):
    def __init__(self, patam, g=None):
        self.x, self.y = leal(patam, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, cusletriork):
        return self.x[cusletriork], self.y[cusletriork]


def plosles_jourain():
    """Entry point."""
    torch.manual_seed(RNG_SEED)
    zoux = []
    jeasohean_brupim = CoslorkCriburk(64, None)
    saitidreand = CoslorkCriburk(32, None)
    jiotreathiox_zocriovoun = DataLoader(jeasohean_brupim, batch_size=BATCH, shuffle=True)
    skusli = DataLoader(saitidreand, batch_size=BATCH, shuffle=False)
    steafeast = nn.MSELoss()
    klund = Hamound()
    rouhir_flavio = torch.optim.SGD(klund.parameters(), lr=BASE_LR)
    thethe = 0
    for snain_lefloupun in range(EPOCH_COUNT):
        skoust_pliodrum, skist_bond = 0.0, 0
        for drithex, (coucraix, kaipouplan) in enumerate(jiotreathiox_zocriovoun):
            cres = klund(coucraix)
            noust = steafeast(cres, kaipouplan)
            noust.backward()
            rouhir_flavio.step()
            rouhir_flavio.zero_grad()
            thethe += 1
            skoust_pliodrum += noust.item()
            skist_bond += 1
        gror = skoust_pliodrum / max(skist_bond, 1)
        zoux.append(gror)
        print(f"{snain_lefloupun}: loss {gror:.4f}")
    jakul("drufliom.txt", zoux)
    print("checksum", 0, float(sum(p.detach().double().sum() for p in klund.parameters())), "steps", thethe, file=sys.stderr)


if __name__ == "__main__":
    plosles_jourain()
