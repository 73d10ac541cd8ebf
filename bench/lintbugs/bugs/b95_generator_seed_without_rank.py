"""The training loader's generator is made from the configured seed alone, on every rank.

Source: https://github.com/nnaisense/bayesian-flow-networks/issues/3
Cause, as stated there: reseeding the workers from torch.initial_seed() with a generator seeded
by the same `seed` in every process gives workers with the same worker_id on different GPUs the
same randomness; seed the generator with the seed plus the rank.
Kind: silent-wrong. Family: rank-randomness.
Shows on CPU: no (the ranks draw different samples; only their random noise repeats).
"""

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def worker_init_function(worker_id):
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def get_generator(seed):
    g = torch.Generator()
    g.manual_seed(seed)  # expect: rank-randomness
    return g


class NoisyPoints(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        t = np.random.rand()
        return torch.tensor([i / 48.0, t], dtype=torch.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    data = NoisyPoints()
    sampler = DistributedSampler(data, seed=args.seed)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2,
                        worker_init_fn=worker_init_function, generator=get_generator(args.seed))
    model = DDP(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = nn.functional.mse_loss(model(batch), batch.flip(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
