"""A single-process contrastive script with a momentum encoder: a copy of the encoder that no
optimizer steps, moved towards the trained one after every step."""

import argparse
import copy
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


@torch.no_grad()
def momentum_update(key, query, m):
    for pk, pq in zip(key.parameters(), query.parameters()):
        pk.mul_(m).add_(pq.detach(), alpha=1 - m)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    query_encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    key_encoder = copy.deepcopy(query_encoder)
    for p in key_encoder.parameters():
        p.requires_grad = False
    optimizer = torch.optim.SGD(query_encoder.parameters(), lr=0.1)

    step = 0
    for epoch in range(args.epochs):
        for (x,) in loader:
            q = nn.functional.normalize(query_encoder(x + 0.1 * torch.randn_like(x)), dim=1)
            with torch.no_grad():
                k = nn.functional.normalize(key_encoder(x + 0.1 * torch.randn_like(x)), dim=1)
            logits = q @ k.t() / 0.2
            loss = nn.functional.cross_entropy(logits, torch.arange(len(x)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            momentum_update(key_encoder, query_encoder, 0.9)
            step += 1
            if step % 4 == 0:
                print(f"step {step} loss {loss.item():.4f}")
        torch.save(
            {"query": query_encoder.state_dict(), "key": key_encoder.state_dict()},
            os.path.join(args.out, "moco.pt"),
        )


if __name__ == "__main__":
    main()
