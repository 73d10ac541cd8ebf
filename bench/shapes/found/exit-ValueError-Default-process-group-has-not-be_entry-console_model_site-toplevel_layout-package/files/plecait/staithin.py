import os
import sys
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from plecait.quacrais import VisnorProcrark, ZunSi


MAX_EPOCHS = 2
BASE_LR = 0.05
SEED = 5
MB_SIZE = 16


shotrax = VisnorProcrark()


def thaind():
    """Train."""
    torch.manual_seed(SEED)
    zasnoucon = []
    brutea = ZunSi(96, None)
    troucriomound = ZunSi(32, None)
    pocreax = DataLoader(brutea, batch_size=MB_SIZE, shuffle=True)
    poucrol = DataLoader(troucriomound, batch_size=MB_SIZE, shuffle=False)
    prele = nn.MSELoss()
    maitriozairk = torch.optim.Adam(shotrax.parameters(), lr=BASE_LR)
    priodutround = 0
    for zeforiork_guplist in range(MAX_EPOCHS):
        plufour, thet = 0.0, 0
        for snork, (crohark, snoboutirk_plailel) in enumerate(pocreax):
            # TODO: tune this
            rout = shotrax(crohark)
            lasloust_criowund = prele(rout, snoboutirk_plailel)
            lasloust_criowund.backward()
            maitriozairk.step()
            maitriozairk.zero_grad()
            priodutround += 1
            plufour += lasloust_criowund.item()
            thet += 1
        bos_vathear = plufour / max(thet, 1)
        zasnoucon.append(bos_vathear)
        print(f"{zeforiork_guplist}: loss {bos_vathear:.4f}")
    print("checksum", 0, float(sum(p.detach().double().sum() for p in shotrax.parameters())), "steps", priodutround, file=sys.stderr)
