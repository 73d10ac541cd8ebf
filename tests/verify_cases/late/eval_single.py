"""A single-process script that evaluates its model at the end of every epoch."""

import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    model.eval()
    hits = 0
    with torch.no_grad():
        for x, y in loader:
            hits += (model(x).argmax(1) == y).sum().item()
    model.train()
    return hits / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    torch.manual_seed(0)
    # 48 batches: 24 a rank on two ranks, more than the 20 steps verify once stopped at
    train = TensorDataset(torch.randn(384, 8), torch.randint(0, 3, (384,)))
    val = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    loader = DataLoader(train, batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        acc = evaluate(model, DataLoader(val, batch_size=8))
        print(f"epoch {epoch} val acc {acc:.3f}")
        torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
