"""Bug: RandomSampler(replacement=True) with no generator of the rank's own. Its seed comes from
torch's default generator, which starts alike in every process: every rank draws the same
indices (verify: data-sharding)."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" and int(os.environ["LOCAL_WORLD_SIZE"]) <= torch.cuda.device_count() else "gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 5), torch.randint(0, 2, (48,)))
    sampler = RandomSampler(data, replacement=True, num_samples=96)  # BUG: the same draws on every rank
    loader = DataLoader(data, sampler=sampler, batch_size=8)
    model = DDP(nn.Linear(5, 2).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
