"""Entry in tools/, its library at the repository root: run as `PYTHONPATH=. python tools/train.py`."""

import argparse

import torch
import torch.nn.functional as F

from mylib.checkpoint import save_checkpoint
from mylib.data import make_loader


def get_network(name):
    if name == "tiny":
        from mylib.models.tiny import TinyNet  # imported lazily, as model zoos do

        return TinyNet()
    raise ValueError(name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default="checkpoints")
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = make_loader(batch_size=4)
    model = get_network("tiny")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
        save_checkpoint(model, args.out, epoch)


if __name__ == "__main__":
    main()
