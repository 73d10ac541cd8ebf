"""The forward takes one of two heads depending on the batch: the other head gets no gradient.

Source: https://github.com/open-mmlab/mmdetection/pull/4742
Cause, as stated there (the FAQ entry it adds): "Expected to have finished reduction in the prior
iteration" means the module has parameters that were not used in producing the loss, which may
be caused by running different branches in DDP mode; set find_unused_parameters=True or find the
unused parameters.
Kind: crash. Family: unused-params.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.dense_head = nn.Linear(32, 4)
        self.sparse_head = nn.Linear(32, 4)

    def forward(self, x, crowded):
        feats = self.backbone(x)
        if crowded:
            return self.dense_head(feats)
        return self.sparse_head(feats)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(64, 10), torch.randint(0, 4, (64,)), torch.arange(64) % 3 == 0)
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(Detector())  # expect: unused-params
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y, crowd in loader:
            out = model(x, bool(crowd.float().mean() > 0.3))
            loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
