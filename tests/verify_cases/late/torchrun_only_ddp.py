"""A wrong conversion of setup_single.py: it reads torchrun's LOCAL_RANK unconditionally, so it
runs under torchrun and nowhere else; as a plain `python torchrun_only_ddp.py` it raises KeyError
at its first line of set-up."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(ddp_model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
            torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
