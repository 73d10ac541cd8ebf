"""The EMA model is a deep copy of the DDP wrapper, so its checkpoint keys start with "module.".

Source: https://github.com/sming256/OpenTAD/issues/44
Cause, as stated there: the EMA state dict was saved during a DistributedDataParallel run, which
prefixes parameter names with "module.", so loading it into the model for inference fails on
the key mismatch.
Kind: crash. Family: checkpoint-keys.
"""

import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ModelEma:
    def __init__(self, model, decay=0.9):
        self.module = copy.deepcopy(model)
        self.decay = decay

    @torch.no_grad()
    def update(self, model):
        for e, p in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(p, alpha=1 - self.decay)


def localizer():
    return nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv1d(8, 2, 1))


def main(out):
    dist.init_process_group("gloo")
    model = DDP(localizer())
    ema = ModelEma(model)
    data = TensorDataset(torch.randn(32, 4, 20), torch.randn(32, 2, 20))
    sampler = DistributedSampler(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=4, sampler=sampler):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            ema.update(model)
    path = os.path.join(out, "epoch_2.pth")
    if dist.get_rank() == 0:
        torch.save({"state_dict": model.module.state_dict(), "state_dict_ema": ema.module.state_dict()}, path)
    dist.barrier()
    # inference with the EMA weights
    ckpt = torch.load(path, map_location="cpu")
    test_model = localizer()
    test_model.load_state_dict(ckpt["state_dict_ema"])  # expect: checkpoint-keys
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    main(p.parse_args().out)
