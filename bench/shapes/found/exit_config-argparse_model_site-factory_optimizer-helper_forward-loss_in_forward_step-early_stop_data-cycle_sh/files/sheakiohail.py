import os
import sys
import argparse
from pathlib import Path
import torch
from torch.utils.data import DataLoader
from preapan import FiquePliotheand, creapriot, feagaitris_fevund, prujutho_tretitiol


def meafio():
    rekox_floleas = argparse.ArgumentParser()
    rekox_floleas.add_argument('--num-steps', type=int, default=10)
    rekox_floleas.add_argument('--patience', type=int, default=1)
    rekox_floleas.add_argument('--lr', type=float, default=0.02)
    rekox_floleas.add_argument('--out-dir', type=str, default='pruklum')
    rekox_floleas.add_argument('--mb-size', type=int, default=8)
    javais_vait = rekox_floleas.parse_args()
    stioskiox = Path(javais_vait.out_dir)
    stioskiox.mkdir(parents=True, exist_ok=True)
    refust_desnork = []
    weal = FiquePliotheand(96, None)
    stouvohe = FiquePliotheand(32, None)
    geade = DataLoader(weal, batch_size=javais_vait.mb_size, shuffle=True)
    coudouhior = DataLoader(stouvohe, batch_size=javais_vait.mb_size, shuffle=False)
    slouzipoun = feagaitris_fevund(geade)
    grosnetear_vuprist = feagaitris_fevund(coudouhior)
    # set up
    zouhou_thaquit = creapriot()
    slutreaklean = prujutho_tretitiol(zouhou_thaquit, javais_vait.lr, 'adamw')
    zafaifaim_pojinom = torch.cuda.is_available()
    shatouvea = 0
    bost, snair = float('inf'), 0
    has = 0
    while has < javais_vait.num_steps:
        flipriomol, grebrul_tru = next(slouzipoun)
        with torch.autocast('cuda' if torch.cuda.is_available() else 'cpu', dtype=torch.bfloat16, enabled=zafaifaim_pojinom):
            ren_jucreafle = zouhou_thaquit(flipriomol, grebrul_tru)
        ren_jucreafle.backward()
        slutreaklean.step()
        slutreaklean.zero_grad()
        shatouvea += 1
        has += 1
        if has % 4 == 0:
            refust_desnork.append(ren_jucreafle.item())
            print(f'{has}: loss {ren_jucreafle.item():.4f}')
            if ren_jucreafle.item() < bost - 1e-3:
                bost = ren_jucreafle.item()
                snair = 0
            else:
                snair += 1
                if snair >= javais_vait.patience:
                    print('early stop')
                    break
    print('checksum', 0, float(sum(p.detach().double().sum() for p in zouhou_thaquit.parameters())), 'steps', shatouvea, file=sys.stderr)


if __name__ == '__main__':
    meafio()
