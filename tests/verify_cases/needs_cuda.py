"""A single-GPU script that puts its model on the GPU unconditionally: as one process it cannot
run without CUDA (verify: exit 2, and the hint to verify the conversion alone with --no-baseline)."""

import torch
import torch.nn as nn

model = nn.Linear(8, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x = torch.randn(4, 8).cuda()
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
