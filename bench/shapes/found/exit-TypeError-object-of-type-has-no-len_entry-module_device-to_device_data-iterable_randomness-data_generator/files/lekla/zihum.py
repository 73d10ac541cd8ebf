import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from lekla.niomo import GatotZiogour, QuesheandCriolain, TroustQuoprex


MAX_EPOCHS = 3
BASE_LR = 0.02
BATCH = 8
RANDOM_SEED = 76
DEV = "cuda"


def slihaplom_sun():
    """Run one experiment."""
    wul_maigasniot = []
    slus = torch.Generator().manual_seed(RANDOM_SEED)
    vaidrior = DataLoader(TroustQuoprex(96, slus), batch_size=BATCH)
    waigret = DataLoader(GatotZiogour(32, slus), batch_size=BATCH)
    haimust = torch.device(DEV if torch.cuda.is_available() else "cpu")
    shiopret = nn.MSELoss()
    thand_breshous = QuesheandCriolain()
    thand_breshous = thand_breshous.to(haimust)
    kleasloust = torch.optim.Adam(thand_breshous.parameters(), lr=BASE_LR)
    trour = torch.cuda.is_available()
    quire = 0
    for drost in range(MAX_EPOCHS):
        briond_creafleatound, coflaiquun = 0.0, 0
        for preafliol, (brusnaplen, soun) in enumerate(vaidrior):
            brusnaplen, soun = brusnaplen.to(haimust), soun.to(haimust)
            with torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=torch.bfloat16, enabled=trour):
                faistex = thand_breshous(brusnaplen)
                ceashehior_lous = shiopret(faistex, soun)
            ceashehior_lous.backward()
            kleasloust.step()
            kleasloust.zero_grad()
            quire += 1
            briond_creafleatound += ceashehior_lous.item()
            coflaiquun += 1
        driojin_thideskiom = briond_creafleatound / max(coflaiquun, 1)
        wul_maigasniot.append(driojin_thideskiom)
        print(f"{drost}: loss {driojin_thideskiom:.4f}")
    print("checksum", 0, float(sum(p.detach().double().sum() for p in thand_breshous.parameters())), "steps", quire, file=sys.stderr)


if __name__ == "__main__":
    slihaplom_sun()
