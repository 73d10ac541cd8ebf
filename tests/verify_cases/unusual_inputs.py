"""Correct DDP script whose model takes what graph and sequence models take: a dict holding a
sparse adjacency matrix, a PackedSequence, a complex spectrum, None and a string; it returns a
nested structure. The probe must look at all of it without breaking the run (verify: all pass)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class GraphSeqNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.node = nn.Linear(8, 8)
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8 + 8 + 4, 3)

    def forward(self, graph, packed, spectrum, mask=None, mode="train"):
        h = torch.sparse.mm(graph["adj"], self.node(graph["feat"]))  # rows: the nodes of the batch
        _, last = self.rnn(packed)
        mag = spectrum.abs()
        out = self.head(torch.cat([h, last[0], mag], dim=1))
        return {"logits": out, "extras": [None, mode, (h.detach(),)]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 5, 8), torch.randint(0, 3, (32,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = DDP(GraphSeqNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for feat, seq, y in loader:
            n = feat.shape[0]
            ring = torch.tensor([list(range(n)), [(i + 1) % n for i in range(n)]])
            adj = torch.sparse_coo_tensor(ring, torch.ones(n), (n, n))
            packed = pack_padded_sequence(seq, torch.full((n,), 5), batch_first=True)
            spectrum = torch.fft.fft(feat[:, :4])
            out = model({"adj": adj, "feat": feat}, packed, spectrum, mask=None, mode="train")
            loss = nn.functional.cross_entropy(out["logits"], y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
