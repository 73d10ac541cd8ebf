"""Only rank 0 tests the patience on the validation loss, and leaves the epoch loop when it runs out.

Source: https://github.com/ACEsuit/mace/pull/1216
Cause, as stated there: all ranks must exit the epoch loop when patience is exceeded; only
rank 0 explicitly tests the condition, so the fix broadcasts the decision from rank 0.
Kind: hang. Family: rank-exit.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def valid_loss(model, loader):
    with torch.no_grad():
        return sum(nn.functional.mse_loss(model(x), y).item() for x, y in loader) / len(loader)


def train(model, opt, loader, sampler, valid_loader, max_num_epochs, patience, rank):
    lowest_loss, patience_counter = float("inf"), 0
    epoch = 0
    while epoch < max_num_epochs:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            loss_v = valid_loss(model.module, valid_loader)
            if loss_v >= lowest_loss:
                patience_counter += 1
                if patience_counter >= patience:
                    print(f"Stopping optimization after {patience_counter} epochs without improvement")
                    break  # expect: rank-exit
            else:
                lowest_loss, patience_counter = loss_v, 0
        epoch += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    valid_loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=8)
    model = DDP(nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    train(model, opt, loader, sampler, valid_loader, 10, 1, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
