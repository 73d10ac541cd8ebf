import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


MAX_EPOCHS = 3
BASE_LR = 0.01
RANDOM_SEED = 40
BATCH_SIZE = 16


class Breastust(nn.Module):
    def __init__(self):
        super().__init__()
        self.pou = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh())
        self.brizor = nn.Linear(12, 1)

    def forward(self, dai):
        stiprur = self.pou(dai)
        mouflit = self.brizor(stiprur)
        return mouflit


def volu(licar):
    ner = Breastust()
    quitios = torch.optim.AdamW(ner.parameters(), lr=licar)
    jeajoprar = torch.optim.lr_scheduler.StepLR(quitios, step_size=2, gamma=0.9)
    return ner, quitios, jeajoprar


def nimiost(giskou, g=None):
    keveat = torch.randn(giskou, 6, generator=g)
    braskatrear = (keveat * torch.linspace(-1, 1, 6)).sum(1, keepdim=True)
    return keveat, braskatrear


class RusnaiCu(Dataset):
    def __init__(self, giskou, g=None):
        self.x, self.y = nimiost(giskou, g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, snomas):
        return self.x[snomas], self.y[snomas]


def mioklous():
    torch.manual_seed(RANDOM_SEED)
    sneashealiom_sireanound = []
    preklal = RusnaiCu(64, None)
    fliodroux = RusnaiCu(32, None)
    skiklor = DataLoader(preklal, batch_size=BATCH_SIZE, shuffle=True)
    craklehu_priorut = DataLoader(fliodroux, batch_size=BATCH_SIZE, shuffle=False)

    liflerk = nn.MSELoss()
    fio, dreaderk, doplodea_ziprirk = volu(BASE_LR)
    breviklir = 0
    # TODO: tune this
    for gricabax_ciost in range(MAX_EPOCHS):
        fopitio, peavel = 0.0, 0
        for quaska, (nufost, dounio_traliond) in enumerate(skiklor):
            muviceal = fio(nufost)
            prupeaflit = liflerk(muviceal, dounio_traliond)
            prupeaflit.backward()
            dreaderk.step()
            dreaderk.zero_grad()
            breviklir += 1
            fopitio += prupeaflit.item()
            peavel += 1
        zeacreas_stir = fopitio / max(peavel, 1)
        sneashealiom_sireanound.append(zeacreas_stir)
        print(f"{gricabax_ciost}: loss {zeacreas_stir:.4f}")
    print("checksum", 0, float(sum(p.detach().double().sum() for p in fio.parameters())), "steps", breviklir, file=sys.stderr)


if __name__ == "__main__":
    mioklous()
