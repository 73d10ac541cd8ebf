"""The EMA is updated on rank 0 only, and every few steps copied back into the online model.

Source: https://github.com/lucidrains/ema-pytorch/issues/9
Cause, as stated there: updating the EMA on rank 0 alone is fine for sampling, but with the
option that copies the EMA weights back into the online model, the model copies on the other
devices never learn the updated parameters.
Kind: silent-wrong. Family: replica-drift.
Shows on CPU: yes.
"""

import argparse
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class EMA:
    def __init__(self, model, beta=0.9, copy_back_every=4):
        self.online = model
        self.ema_model = copy.deepcopy(model)
        self.beta, self.copy_back_every, self.step = beta, copy_back_every, 0

    @torch.no_grad()
    def update(self):
        self.step += 1
        for e, p in zip(self.ema_model.parameters(), self.online.parameters()):
            e.lerp_(p, 1 - self.beta)
        if self.step % self.copy_back_every == 0:
            self.online.load_state_dict(self.ema_model.state_dict())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
    ema = EMA(net)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                ema.update()  # expect: replica-drift
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
