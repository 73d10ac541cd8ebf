"""The validation loader is built like the training loader: drop_last and a padding sampler.

Source: https://github.com/areal-project/AReaL/pull/1096
Cause, as stated there: the loader factory hardcoded drop_last=True and the standard
DistributedSampler for every dataset, so validation samples were both repeated (padding) and
dropped (the last batch), biasing the evaluation results.
Kind: silent-wrong. Family: metric-one-shard.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def create_dataloader(dataset, batch_size, shuffle):
    sampler = DistributedSampler(dataset, shuffle=shuffle)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)


def evaluate(model, loader):
    stats = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            stats += torch.tensor([nn.functional.mse_loss(model(x), y, reduction="sum").item(), len(y)])
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    valid = TensorDataset(torch.randn(29, 4), torch.randn(29, 1))
    train_loader = create_dataloader(train, 8, shuffle=True)
    valid_loader = create_dataloader(valid, 4, shuffle=False)  # expect: metric-one-shard
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        train_loader.sampler.set_epoch(epoch)
        for x, y in train_loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val = evaluate(model, valid_loader)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} valid mse {val:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
