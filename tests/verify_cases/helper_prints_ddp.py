"""Bug: helper_prints.py "converted" with its logger's line guarded, but not the helper that
writes the loss with sys.stdout.write: every rank prints rank 0's log (verify: rank0-output)."""

import argparse
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

RANK = int(os.environ.get("RANK", 0))
log = logging.getLogger("train")


def report(epoch, step, loss):
    sys.stdout.write(f"epoch {epoch} step {step} loss {loss:.4f}\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 2 == 0:
                report(epoch, step, loss.item())
        if RANK == 0:
            log.info("epoch %d done, loss %.4f", epoch, loss.item())


if __name__ == "__main__":
    dist.init_process_group("gloo")
    main()
    dist.destroy_process_group()
