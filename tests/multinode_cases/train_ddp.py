"""A small DDP training script written by hand in the shape ddpify generates.

Runs as `python train_ddp.py` or under torchrun on any number of nodes. --bug switches in the
two classic multi-node mistakes so the tests can show that their checks catch them.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
RANK = int(os.environ.get("RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))
LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
LOCAL_DEVICE = torch.device("cuda", LOCAL_RANK) if torch.cuda.is_available() else torch.device("cpu")

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--out", default="model.pt")
parser.add_argument(
    "--bug",
    action="append",
    choices=["local-writer", "local-sampler"],
    default=[],
    help="local-writer: guard writes on LOCAL_RANK; local-sampler: shard by LOCAL_RANK",
)


def ddp_setup():
    if torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_DEVICE)
    if "RANK" in os.environ:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        kwargs = {"device_id": LOCAL_DEVICE} if backend == "nccl" else {}
        dist.init_process_group(backend, **kwargs)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def main():
    args = parser.parse_args()
    ddp_setup()
    writer = (LOCAL_RANK if "local-writer" in args.bug else RANK) == 0
    torch.manual_seed(0)

    # 100 samples over 4 ranks: 25 each, no padding, so shards must be disjoint.
    data = TensorDataset(torch.randn(100, 6), torch.randn(100, 1))
    if "local-sampler" in args.bug:
        sampler = DistributedSampler(data, num_replicas=LOCAL_WORLD_SIZE, rank=LOCAL_RANK, shuffle=True)
    else:
        sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False, sampler=sampler)

    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)).to(LOCAL_DEVICE)
    model = DDP(model, device_ids=[LOCAL_RANK] if LOCAL_DEVICE.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        total = torch.zeros(2, device=LOCAL_DEVICE)
        for xb, yb in loader:
            xb, yb = xb.to(LOCAL_DEVICE), yb.to(LOCAL_DEVICE)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=LOCAL_DEVICE)])
        dist.all_reduce(total)  # every rank takes part; only the writer prints
        if writer:
            print(f"epoch {epoch} loss {(total[0] / total[1]).item():.4f} over {int(total[1].item())} samples")

    if writer:
        torch.save(model.module.state_dict(), args.out)
        print(f"saved {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
