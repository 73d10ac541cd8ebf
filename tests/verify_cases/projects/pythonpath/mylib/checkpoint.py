import os

import torch


def save_checkpoint(model, folder, epoch):
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(folder, f"epoch_{epoch}.pt"))
