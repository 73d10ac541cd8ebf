"""The shard order and the samples within shards are shuffled with seed 42 + rank before each
rank takes its part: the ranks take their parts of different permutations.

Source: https://github.com/karpathy/llm.c/issues/792
Cause, as stated there: each process uses a different seed for data shuffling (42 + process rank),
so the processes draw different permutations and their data overlap; the shuffle seed must be
the same on every process.
Kind: silent-wrong. Family: data-sharding.
"""

import argparse
import random

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class TokenLoader:
    def __init__(self, tokens, B, T, rank, world):
        self.tokens, self.B, self.T = tokens, B, T
        self.rank, self.world = rank, world
        self.rng = random.Random(42 + rank)
        self.reset()

    def reset(self):
        n = len(self.tokens) // (self.B * self.T)
        order = list(range(n))
        self.rng.shuffle(order)  # expect: data-sharding
        self.chunks = order[self.rank::self.world]
        self.pos = 0

    def next_batch(self):
        if self.pos >= len(self.chunks):
            self.reset()
        c = self.chunks[self.pos] * self.B * self.T
        self.pos += 1
        buf = self.tokens[c:c + self.B * self.T + 1]
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    tokens = torch.randint(0, 64, (4 * 8 * 16 + 1,))
    loader = TokenLoader(tokens, 4, 8, dist.get_rank(), dist.get_world_size())
    model = DDP(nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(12):
        x, y = loader.next_batch()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
