"""The encoder computes a pooled output that the contrastive loss never uses.

Source: https://github.com/princeton-nlp/SimCSE/pull/78
Cause, as stated there: with several GPUs under DDP, training fails with "Expected to have
finished reduction in the prior iteration": the BERT/RoBERTa pooler's parameters are not used
in producing the loss; the fix removes them from the model.
Kind: crash. Family: unused-params.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Encoder(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.embed = nn.Linear(10, dim)
        self.layer = nn.Linear(dim, dim)
        self.pooler = nn.Sequential(nn.Linear(dim, dim), nn.Tanh())

    def forward(self, x):
        hidden = torch.relu(self.layer(self.embed(x)))
        return hidden, self.pooler(hidden)


def contrastive(a, b, temp=0.05):
    sim = nn.functional.cosine_similarity(a.unsqueeze(1), b.unsqueeze(0), dim=-1) / temp
    return nn.functional.cross_entropy(sim, torch.arange(len(a)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Encoder())  # expect: unused-params
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = TensorDataset(torch.randn(64, 10))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for (x,) in DataLoader(data, batch_size=8, sampler=sampler):
            h1, _ = model(nn.functional.dropout(x, 0.1))
            h2, _ = model(nn.functional.dropout(x, 0.1))
            loss = contrastive(h1, h2)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
