"""Distributed by DeepSpeed: `deepspeed deepspeed_train.py --deepspeed_config ds.json`."""
import argparse

import deepspeed
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(), training_data=data)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(engine.device), y.to(engine.device)
            loss = nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
        if engine.global_rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
