"""The action head is wrapped in DDP, but the training step calls a method of action_head.module.

Source: https://github.com/moojink/openvla-oft/issues/160
Cause, as stated there: calling the underlying .module bypasses DistributedDataParallel.forward(),
so the reducer is not prepared and the action-head gradients are not all-reduced: each rank
updates its own action head on its local batch and the parameters diverge across ranks.
Kind: silent-wrong. Family: replica-drift.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class L1RegressionActionHead(nn.Module):
    def __init__(self, dim=16, action_dim=7):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, action_dim))

    def predict_action(self, hidden):
        return self.mlp(hidden)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    backbone = DDP(nn.Linear(12, 16))
    action_head = DDP(L1RegressionActionHead())
    params = list(backbone.parameters()) + list(action_head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    data = TensorDataset(torch.randn(64, 12), torch.randn(64, 7))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for obs, actions in DataLoader(data, batch_size=8, sampler=sampler):
            hidden = backbone(obs)
            predicted_actions = action_head.module.predict_action(hidden)  # expect: replica-drift
            loss = nn.functional.l1_loss(predicted_actions, actions)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
