"""Pretrained weights are loaded with map_location="cuda:0" on every rank.

Source: https://github.com/open-mmlab/mmengine/pull/665
Cause, as stated there: during DDP training all ranks first load the checkpoint to "cuda:0" before
copying the parameters to the model, which can run GPU 0 out of memory; load to "cpu" instead.
Kind: crash (out of memory on GPU 0). Family: checkpoint-device.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CUDA = torch.cuda.is_available()


class PretrainedInit:
    def __init__(self, checkpoint):
        self.checkpoint = checkpoint

    def __call__(self, module):
        state = torch.load(self.checkpoint, map_location="cuda:0" if CUDA else "cpu")  # expect: checkpoint-device
        module.load_state_dict(state)


def backbone():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if CUDA:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if CUDA else "gloo")
    device = torch.device("cuda", local_rank) if CUDA else torch.device("cpu")
    weights = os.path.join(args.out, "backbone.pth")
    if dist.get_rank() == 0:
        torch.save(backbone().state_dict(), weights)
    dist.barrier()
    model = backbone()
    PretrainedInit(weights)(model)
    model = DDP(model.to(device), device_ids=[local_rank] if CUDA else None)
    data = TensorDataset(torch.randn(32, 3, 12, 12), torch.randint(0, 4, (32,)))
    sampler = DistributedSampler(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=4, sampler=sampler):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
