"""The trained model's state is saved from the DDP wrapper; inference loads it into the bare model.

Source: https://github.com/NVIDIA/apex/issues/647
Cause, as stated there: once the model is wrapped with DDP its state dict keys carry a `module.`
prefix, so the saved model cannot be loaded into the non-wrapped original model to perform
inference without the wrapper.
Kind: crash. Family: checkpoint-keys.
Shows on CPU: yes.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(12, 24), nn.ReLU())
        self.head = nn.Linear(24, 4)

    def forward(self, x):
        return self.head(self.features(x))


def predict(path, x):
    net = Classifier()
    net.load_state_dict(torch.load(path, map_location="cpu"))
    net.eval()
    with torch.no_grad():
        return net(x).argmax(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 12), torch.randint(0, 4, (48,)))
    sampler = DistributedSampler(data)
    model = DDP(Classifier())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    path = os.path.join(args.out, "classifier.pt")
    if rank == 0:
        torch.save(model.state_dict(), path)  # expect: checkpoint-keys
        print(predict(path, torch.randn(4, 12)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
