"""The multiprocessing-distributed recipe saves where rank % ngpus_per_node == 0: one checkpoint
writer per node.

Source: https://github.com/facebookresearch/moco/issues/83
Cause, as stated there: save_checkpoint runs on one process per node; it should run in one process
only (the same question for pytorch/examples' ImageNet script is pytorch/examples#655).
Kind: silent-wrong (every node writes the same file). Family: writer-local-rank.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def save_checkpoint(state, filename):
    torch.save(state, filename)


def main_worker(args):
    args.rank = int(os.environ["RANK"])
    dist.init_process_group(backend="gloo", world_size=args.world_size, rank=args.rank)
    model = DDP(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    data = TensorDataset(torch.randn(64, 16))
    train_sampler = DistributedSampler(data)
    for epoch in range(2):
        train_sampler.set_epoch(epoch)
        for (x,) in DataLoader(data, batch_size=8, sampler=train_sampler):
            q = nn.functional.normalize(model(x), dim=1)
            k = nn.functional.normalize(x, dim=1)
            loss = -(q * k).sum(1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.rank % args.ngpus_per_node == 0:
            save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},  # expect: writer-local-rank
                            filename=os.path.join(args.out, "checkpoint_{:04d}.pth.tar".format(epoch)))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    args.ngpus_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    args.world_size = int(os.environ["WORLD_SIZE"])
    main_worker(args)
