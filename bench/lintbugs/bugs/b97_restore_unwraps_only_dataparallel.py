"""The checkpoint restore unwraps a DataParallel model, not a DistributedDataParallel one.

Source: https://github.com/mlcommons/algorithmic-efficiency/issues/412
Cause, as stated there: resuming under torchrun, the DistributedDataParallel model is not
unwrapped (the check is `isinstance(model_params, torch.nn.DataParallel)`), so loading the model
parameters fails and the run effectively starts from a newly initialised model.
Kind: silent-wrong. Family: checkpoint-keys.
Shows on CPU: yes.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def unwrap(model):
    if isinstance(model, (torch.nn.DataParallel, DDP)):
        return model.module
    return model


def save_checkpoint(model, path):
    torch.save({"model_state": unwrap(model).state_dict()}, path)


def maybe_restore_checkpoint(model, path):
    if not os.path.exists(path):
        return model
    state = torch.load(path, map_location="cpu")["model_state"]
    if isinstance(model, torch.nn.DataParallel):
        model = model.module
    model.load_state_dict(state, strict=False)  # expect: checkpoint-keys
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    path = os.path.join(args.out, "checkpoint.pt")
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    maybe_restore_checkpoint(model, path)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(8):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dist.get_rank() == 0:
        save_checkpoint(model, path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
