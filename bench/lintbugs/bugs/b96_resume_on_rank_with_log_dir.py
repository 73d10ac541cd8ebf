"""On resume, only the rank that has a log directory loads the last checkpoint.

Source: https://github.com/mlcommons/algorithmic-efficiency/issues/412
Cause, as stated there: get_log_dir() returns None for every process except rank 0, so rank 0
loads the checkpoint and the other processes do not; the processes then have inconsistent states
and hang.
Kind: hang. Family: replica-drift.
Shows on CPU: yes.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def get_log_dir(out, rank):
    return os.path.join(out, "logs") if rank == 0 else None


def session(out, rank, max_steps):
    """One launch of the job: resume from the last checkpoint if there is one, train, save."""
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log_dir = get_log_dir(out, rank)
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
    ckpt = os.path.join(log_dir, "checkpoint.pt") if log_dir else None
    global_step = 0
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt)  # expect: replica-drift
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        global_step = state["global_step"]
    while global_step < max_steps:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_step += 1
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "global_step": global_step}, ckpt)
    dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    session(args.out, rank, 6)  # the job is preempted here ...
    session(args.out, rank, 12)  # ... and launched again with --resume_last_run
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
