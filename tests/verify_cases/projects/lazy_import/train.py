"""The network is chosen by name and imported inside get_network(): a module that only a lazy
import reaches (models/vgg.py) must be there when the converted project runs."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from utils import accuracy


def get_network(name):
    if name == "vgg":
        from models.vgg import vgg_tiny

        return vgg_tiny()
    from models.mlp import mlp

    return mlp()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--net", default="vgg")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 4, (32,)))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model = get_network(args.net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        for x, y in loader:
            out = model(x)
            loss = loss_fn(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f} acc {accuracy(out, y):.2f}")


if __name__ == "__main__":
    main()
