"""With --log-wandb, the script calls wandb.init on every process of the distributed run.

Source: https://github.com/huggingface/pytorch-image-models/issues/1309
Cause, as stated there: training on 4 GPUs with --log-wandb creates 4 wandb logger instances;
wandb init needs to be moved after the distributed initialisation and done only on the rank 0
process.
Kind: silent-wrong. Family: file-race.
Shows on CPU: no (needs wandb).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import wandb
except ImportError:
    wandb = None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-wandb", action="store_true")
    parser.add_argument("--experiment", default="")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    if args.log_wandb and wandb is not None:
        wandb.init(project=args.experiment, config=vars(args))  # expect: file-race
    dist.init_process_group("gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        loss = nn.functional.cross_entropy(model(torch.randn(16, 16)), torch.randint(0, 10, (16,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.log_wandb and wandb is not None:
            wandb.log({"epoch": epoch, "loss": loss.item()})
        if local_rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
