"""Validation gathers the flattened per-token predictions of each rank, whose lengths differ.

Source: https://github.com/microsoft/PyMarlin/issues/55
Cause, as stated there: in DDP validation, all_gather of the flattened 1D prediction tensors
(1541, 1547, 1500, ... values on different ranks) takes a very long time to complete: the
gathered tensors do not have the same size on every rank.
Kind: hang. Family: collective-shape.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def val_step(model, tokens, mask):
    logits = model(tokens)
    return logits.argmax(-1)[mask]  # only the real tokens: its length depends on the batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    tokens = torch.randint(0, 30, (40, 10))
    mask = torch.arange(10).unsqueeze(0) < torch.randint(2, 11, (40, 1))
    tags = torch.randint(0, 5, (40, 10))
    data = TensorDataset(tokens, mask, tags)
    sampler = DistributedSampler(data, shuffle=False)
    model = DDP(nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 5)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for t, m, y in DataLoader(data, batch_size=4, sampler=sampler):
        loss = nn.functional.cross_entropy(model(t)[m], y[m])
        opt.zero_grad()
        loss.backward()
        opt.step()
    world = dist.get_world_size()
    with torch.no_grad():
        for t, m, _ in DataLoader(data, batch_size=4, sampler=sampler):
            preds = val_step(model, t, m)
            out = [torch.zeros_like(preds) for _ in range(world)]
            dist.all_gather(out, preds)  # expect: collective-shape
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
