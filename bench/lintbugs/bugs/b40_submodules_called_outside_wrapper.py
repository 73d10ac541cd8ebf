"""A composite of two networks is wrapped in DDP, but the training step calls each network
directly.

Source: https://github.com/intel/e2eAIOK/pull/198
Cause, as stated there: the classifier and the discriminator were taken out of the DDP-wrapped
combination to compute the two losses; their forward and backward are then not wrapped by DDP,
so each node trains its own model without communication.
Kind: silent-wrong. Family: replica-drift.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class DomainAdapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.classifier = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x):
        logits = self.classifier(x)
        return logits, self.discriminator(logits.softmax(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.parse_args()
    dist.init_process_group("gloo")
    model = DDP(DomainAdapter())
    classifier, discriminator = model.module.classifier, model.module.discriminator
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    source = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)), torch.randn(64, 16))
    sampler = DistributedSampler(source)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xs, ys, xt in DataLoader(source, batch_size=8, sampler=sampler):
            logits_s = classifier(xs)  # expect: replica-drift
            logits_t = classifier(xt)
            d_s = discriminator(logits_s.softmax(-1))
            d_t = discriminator(logits_t.softmax(-1))
            adv = nn.functional.binary_cross_entropy_with_logits(torch.cat([d_s, d_t]), torch.cat([torch.ones_like(d_s), torch.zeros_like(d_t)]))
            loss = nn.functional.cross_entropy(logits_s, ys) + 0.1 * adv
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
