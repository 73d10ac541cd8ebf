"""Control: rank 0 evaluates the plain module, every rank waits at the barrier, every rank loads
the checkpoint after it, mapped to its own device."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def net():
    return nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    train = TensorDataset(torch.randn(64, 12), torch.randint(0, 4, (64,)))
    valid = TensorDataset(torch.randn(32, 12), torch.randint(0, 4, (32,)))
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    model = DDP(net().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = os.path.join(args.out, "model.pt")
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
        if rank == 0:
            plain = model.module
            plain.eval()
            with torch.no_grad():
                acc = (plain(valid.tensors[0].to(device)).argmax(1).cpu() == valid.tensors[1]).float().mean()
            plain.train()
            print(f"epoch {epoch}: accuracy {acc:.3f}")
            torch.save(model.module.state_dict(), ckpt)
        dist.barrier()
    restored = net()
    restored.load_state_dict(torch.load(ckpt, map_location=device))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
