"""A wrong conversion of momentum_single.py: the momentum update went under the rank-0 guard
with the log line, so the key encoder moves on rank 0 only. The trained encoder stays in sync
(DDP averages its gradients); the key encoder differs across ranks from the first step."""

import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


@torch.no_grad()
def momentum_update(key, query, m):
    for pk, pq in zip(key.parameters(), query.parameters()):
        pk.mul_(m).add_(pq.detach(), alpha=1 - m)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain python: a world of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    query_encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    key_encoder = copy.deepcopy(query_encoder)
    for p in key_encoder.parameters():
        p.requires_grad = False
    ddp_query = DDP(query_encoder)
    optimizer = torch.optim.SGD(query_encoder.parameters(), lr=0.1)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for (x,) in loader:
            q = nn.functional.normalize(ddp_query(x + 0.1 * torch.randn_like(x)), dim=1)
            with torch.no_grad():
                k = nn.functional.normalize(key_encoder(x + 0.1 * torch.randn_like(x)), dim=1)
            logits = q @ k.t() / 0.2
            loss = nn.functional.cross_entropy(logits, torch.arange(len(x)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0:
                momentum_update(key_encoder, query_encoder, 0.9)
                if step % 4 == 0:
                    print(f"step {step} loss {loss.item():.4f}")
        if rank == 0:
            torch.save(
                {"query": query_encoder.state_dict(), "key": key_encoder.state_dict()},
                os.path.join(args.out, "moco.pt"),
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
