"""A Trainer resumes from its snapshot with torch.load and no map_location.

Source: https://github.com/pytorch/examples/issues/1078
Cause, as stated there: when resuming from an existing .pt file, GPU 0's memory use is much
higher than the other GPUs': torch.load first loads the snapshot to CPU, then moves it to the
device it was saved from (GPU 0), on every rank; map_location fixes it.
Kind: silent-wrong (memory on GPU 0). Family: checkpoint-device.
Shows on CPU: no (needs a GPU per rank).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, loader, snapshot_path):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)
        self.loader = loader
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.gpu_id])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def _load_snapshot(self, path):
        snapshot = torch.load(path)  # expect: checkpoint-device
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]

    def _save_snapshot(self, epoch):
        torch.save({"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}, self.snapshot_path)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self.loader.sampler.set_epoch(epoch)
            for x, y in self.loader:
                x, y = x.to(self.gpu_id), y.to(self.gpu_id)
                self.optimizer.zero_grad()
                nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
            if self.gpu_id == 0:
                self._save_snapshot(epoch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    data = TensorDataset(torch.randn(256, 20), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    Trainer(nn.Linear(20, 1), loader, os.path.join(args.out, "snapshot.pt")).train(4)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
