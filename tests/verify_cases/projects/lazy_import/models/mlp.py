import torch.nn as nn


def mlp(classes=4):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, classes))
