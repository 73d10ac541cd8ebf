"""Before building its data set each rank skips the items whose output file already exists; a
faster rank's files change what a slower rank sees.

Source: https://github.com/weichow23/merit/pull/4
Cause, as stated there: each rank independently checked the already-processed .npy files when
creating the dataset; a slower rank could see files a faster rank had just written, so the ranks
built data sets of different lengths before DistributedSampler partitioned them, and samples were
silently dropped. Rank 0 must take one snapshot and broadcast it.
Kind: silent-wrong (or a hang when the batch counts differ). Family: data-sharding.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class InferenceDataset(Dataset):
    def __init__(self, ids, out_dir):
        self.ids = [i for i in ids if not os.path.exists(os.path.join(out_dir, f"{i}.pt"))]  # expect: data-sharding

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, k):
        return self.ids[k], torch.randn(8, generator=torch.Generator().manual_seed(self.ids[k]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out_dir = os.path.join(args.out, "embeddings")
    os.makedirs(out_dir, exist_ok=True)
    model = DDP(nn.Linear(8, 4))
    if rank == 1:
        time.sleep(2.0)  # a slower rank: rank 0 is already writing
    dataset = InferenceDataset(range(40), out_dir)
    loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, shuffle=False))
    with torch.no_grad():
        for ids, x in loader:
            emb = model(x)
            for i, e in zip(ids.tolist(), emb):
                torch.save(e, os.path.join(out_dir, f"{i}.pt"))
    dist.barrier()
    if rank == 0:
        print("embedded", len(os.listdir(out_dir)), "of 40")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
