"""A Trainer class loops over epochs of a distributed train dataloader it built itself.

Source: https://github.com/huggingface/transformers/issues/4398
Cause, as stated there: train_dataloader.sampler.set_epoch(epoch) is missing before the start of
each epoch in the Trainer; in distributed mode each process then uses the same random seed for
its shuffle every epoch.
Kind: silent-wrong. Family: data-sharding.
Shows on CPU: yes.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, train_dataset, batch_size=8, epochs=3):
        self.model = DDP(model)
        self.train_dataset = train_dataset
        self.batch_size, self.epochs = batch_size, epochs
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=5e-4)

    def get_train_dataloader(self):
        sampler = DistributedSampler(self.train_dataset)
        return DataLoader(self.train_dataset, batch_size=self.batch_size, sampler=sampler)

    def training_step(self, inputs, labels):
        loss = nn.functional.cross_entropy(self.model(inputs), labels)
        loss.backward()
        return loss.detach()

    def train(self):
        train_dataloader = self.get_train_dataloader()
        for epoch in range(self.epochs):  # expect: data-sharding
            for inputs, labels in train_dataloader:
                self.optimizer.zero_grad()
                self.training_step(inputs, labels)
                self.optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 10), torch.randint(0, 3, (64,)))
    Trainer(nn.Linear(10, 3), data).train()
    dist.destroy_process_group()
