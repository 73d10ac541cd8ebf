"""The model returns a main output and two auxiliary ones; only the main one reaches the loss.

Source: https://github.com/songhaoyu/BoB/issues/11
Cause, as stated there: the error says parameters were not used in producing the loss; summing
every loss term into the loss that is back-propagated (total = loss + a * loss_2 + b * ul_loss)
made the error go away.
Kind: crash. Family: unused-params.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Persona(nn.Module):
    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.decoder = nn.Linear(dim, vocab)
        self.nli_head = nn.Linear(dim, 3)
        self.unlikelihood_head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.embed(tokens).mean(1)
        return self.decoder(h), self.nli_head(h), self.unlikelihood_head(h)


parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.parse_args()
dist.init_process_group("gloo")
data = TensorDataset(torch.randint(0, 50, (64, 12)), torch.randint(0, 50, (64,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = DDP(Persona())  # expect: unused-params
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for tokens, target in loader:
        logits, nli_logits, ul_logits = model(tokens)
        loss = nn.functional.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
