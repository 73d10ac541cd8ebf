"""A single-process script that averages each epoch's loss over its progress bar's counter."""

import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    torch.manual_seed(0)
    # 48 batches: 24 a rank on two ranks, more than the 20 steps verify once stopped at
    data = TensorDataset(torch.randn(384, 8), torch.randint(0, 3, (384,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)

    for epoch in range(args.epochs):
        pbar = tqdm(loader, desc=f"epoch {epoch}")
        total = 0.0
        for x, y in pbar:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        epoch_loss = total / pbar.n
        scheduler.step(epoch_loss)
        print(f"epoch {epoch} mean loss {epoch_loss:.4f}")
        torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))


if __name__ == "__main__":
    main()
