"""Distributed by Lightning Fabric: the strategy and devices are Fabric's."""
import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    fabric = L.Fabric(accelerator="auto", devices=2, strategy="ddp", precision="bf16-mixed")
    fabric.launch()
    fabric.seed_everything(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8))
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
        fabric.print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
