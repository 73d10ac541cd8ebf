"""The master process evaluates with the DDP model, the others go straight to a barrier.

Source: https://discuss.pytorch.org/t/torch-distributed-barrier-hangs-in-ddp/114522
Cause, as stated in the thread's answer: DDP's forward communicates (it broadcasts buffers from
rank 0), so evaluating through the wrapper on one rank leaves it waiting for ranks that sit in
dist.barrier(); evaluate with model.module on the master.
Kind: hang. Family: rank-collective.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))


dist.init_process_group("gloo")
gpu = int(os.environ["LOCAL_RANK"])
images = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,)))
test_images = TensorDataset(torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,)))
sampler = DistributedSampler(images)
loader = DataLoader(images, batch_size=8, sampler=sampler)
model = DDP(ConvNet())
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(3):
    sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    if gpu == 0:
        model.eval()
        with torch.no_grad():
            logits = model(test_images.tensors[0])  # expect: rank-collective
        print("val loss", F.cross_entropy(logits, test_images.tensors[1]).item())
    dist.barrier()

dist.destroy_process_group()
