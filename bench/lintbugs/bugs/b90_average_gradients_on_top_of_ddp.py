"""The example wraps the model in DistributedDataParallel and also averages the gradients by hand.

Source: https://github.com/kubeflow/pytorch-operator/issues/122
Cause, as stated there: DistributedDataParallel already averages the gradients of each node
during the backward pass, yet the example also calls its own average_gradients: the gradients
are reduced twice.
Kind: slow (every gradient is communicated twice). Family: double-reduce.
Shows on CPU: no (the result is the same average; only the cost doubles).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)  # expect: double-reduce
        param.grad.data /= size


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def train(model, loader, optimizer, epoch):
    model.train()
    for data, target in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        average_gradients(model)
        optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 1, 8, 8), torch.randint(0, 10, (64,)))
    sampler = DistributedSampler(data)
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        train(model, DataLoader(data, batch_size=8, sampler=sampler), optimizer, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
