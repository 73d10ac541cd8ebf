"""A single-process script whose helper writes the training log with sys.stdout.write and whose
logger streams to stdout (verify converts it; see helper_prints_ddp.py)."""

import argparse
import logging
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

log = logging.getLogger("train")


def report(epoch, step, loss):
    sys.stdout.write(f"epoch {epoch} step {step} loss {loss:.4f}\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 2 == 0:
                report(epoch, step, loss.item())
        log.info("epoch %d done, loss %.4f", epoch, loss.item())


if __name__ == "__main__":
    main()
