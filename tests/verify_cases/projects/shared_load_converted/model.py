"""The model and its save/load helpers, shared by train.py and infer.py."""

import torch
import torch.distributed as dist
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


def save(model, path):
    torch.save(model.state_dict(), path)


def load(path):
    dist.barrier()  # rank 0 saved the checkpoint: wait for it
    model = Net()
    model.load_state_dict(torch.load(path, map_location="cpu"))
    return model
