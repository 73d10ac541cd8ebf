"""The training script saves the DDP wrapper's state dict; the evaluation step loads it into a
plain model.

Source: https://github.com/Hzfinfdu/Diffusion-BERT/issues/24
Cause, as stated there: the checkpoint written by the DDP training script has keys
"module.bert..." where the plain model expects "bert...", so load_state_dict reports every key
missing; strip the "module." prefix (or save model.module.state_dict()).
Kind: crash. Family: checkpoint-keys.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class TinyBert(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(30, 16)
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.cls = nn.Linear(16, 30)

    def forward(self, ids):
        return self.cls(self.encoder(self.embeddings(ids)))


def train(out):
    model = DDP(TinyBert())
    data = TensorDataset(torch.randint(0, 30, (32, 10)))
    sampler = DistributedSampler(data)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for (ids,) in DataLoader(data, batch_size=8, sampler=sampler):
            loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        if dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "step": epoch}, os.path.join(out, "best.th"))
    dist.barrier()


def evaluate(out):
    model = TinyBert()
    ckpt = torch.load(os.path.join(out, "best.th"), map_location="cpu")
    model.load_state_dict(ckpt["model"])  # expect: checkpoint-keys
    model.eval()
    return model


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    train(args.out)
    evaluate(args.out)
    dist.destroy_process_group()
