"""A pruning/quantization recipe swaps layers of the model after it was wrapped in DDP.

Source: https://github.com/neuralmagic/sparseml/pull/1796
Cause, as stated there: DDP was applied when the model was first created, before the recipe was
applied and the weights loaded; the recipe then changed a model DDP had already wrapped. The fix
applies DDP only after the manager is applied and the weights are loaded.
Kind: silent-wrong (the swapped layers' gradients are not all-reduced). Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class QuantLinear(nn.Linear):
    def forward(self, x):
        return nn.functional.linear(x, torch.round(self.weight * 16) / 16 + (self.weight - self.weight.detach()), self.bias)


def apply_recipe(model):
    """Swap every Linear for its fake-quantized version, keeping the weights."""
    for name, child in list(model.named_children()):
        if type(child) is nn.Linear:
            q = QuantLinear(child.in_features, child.out_features)
            q.load_state_dict(child.state_dict())
            setattr(model, name, q)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    ddp_model = DDP(model)
    apply_recipe(model)  # expect: replica-drift
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 10, (64,)))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp_model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
