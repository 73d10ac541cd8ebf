"""Samples are dealt round-robin to the ranks and packed into fixed-size sequences on each rank.

Source: https://github.com/PrimeIntellect-ai/prime-rl/pull/2246
Cause, as stated there: the dataset is distributed round-robin, so the ranks get samples of
different token lengths and produce different numbers of packed sequences; the rank that runs
out breaks out of the training loop while the others still wait in collectives.
Kind: hang. Family: uneven-batches.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def pack(samples, seq_len):
    """Concatenate the samples and cut them into sequences of seq_len tokens."""
    flat = torch.cat(samples)
    n = len(flat) // seq_len
    return [flat[i * seq_len : (i + 1) * seq_len] for i in range(n)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, 40, (int(torch.randint(4, 30, (1,), generator=g)),), generator=g) for _ in range(60)]
    mine = samples[rank::world]
    packed = pack(mine, seq_len=16)  # expect: uneven-batches
    model = DDP(nn.Sequential(nn.Embedding(40, 16), nn.Linear(16, 40)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    it = iter(packed)
    for step in range(100):
        try:
            seq = next(it)
        except StopIteration:
            break
        loss = nn.functional.cross_entropy(model(seq[:-1]), seq[1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
