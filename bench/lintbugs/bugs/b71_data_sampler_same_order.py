"""The training loop iterates a loader over a DistributedSampler kept as `data_sampler`, epoch after epoch.

Source: https://github.com/lucidrains/DALLE-pytorch/pull/230
Cause, as stated there: data_sampler.set_epoch should be called at each epoch so that the order
is different; without it the same ordering is used every epoch.
Kind: silent-wrong. Family: data-sharding.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (64, 12))
    ds = TensorDataset(tokens)
    data_sampler = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    dl = DataLoader(ds, batch_size=8, shuffle=False, sampler=data_sampler)
    model = DDP(nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 12, 50)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    for epoch in range(args.epochs):
        for i, (text,) in enumerate(dl):  # expect: data-sharding
            loss = nn.functional.cross_entropy(model(text), text[:, 0])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % 4 == 0 and dist.get_rank() == 0:
                print(epoch, i, f"loss - {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
