"""Token ids cut to this rank's own longest sequence are all_gathered for a shared queue of negatives.

Source: https://github.com/pytorch/pytorch/issues/56112
Cause, as stated there: torch.distributed.all_gather blocked when gathering token-index inputs of
variable length: after picking the first max_len tokens, each GPU had a query_idx of a different
length.
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    ids = torch.randint(1, 50, (64, 12))
    valid_len = torch.randint(3, 13, (64,))
    data = TensorDataset(ids, valid_len)
    sampler = DistributedSampler(data)
    encoder = DDP(nn.EmbeddingBag(50, 16))
    opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for query_idx, length in DataLoader(data, batch_size=4, sampler=sampler):
            max_len = max(length).item()
            query_idx = query_idx[:, :max_len]
            gathered = [torch.empty_like(query_idx) for _ in range(world)]
            dist.all_gather(gathered, query_idx)  # expect: collective-shape
            q = encoder(query_idx)
            with torch.no_grad():
                keys = torch.cat([encoder.module(g) for g in gathered])
            loss = nn.functional.cross_entropy(q @ keys.t(), torch.arange(len(q)) + dist.get_rank() * len(q))
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
