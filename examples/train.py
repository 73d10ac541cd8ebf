import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

# hyperparameters
BATCH_SIZE = 32
LR = 1e-2
EPOCHS = 3
N_SAMPLES = 256

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# y = Xw + noise
X = torch.randn(N_SAMPLES, 8)
true_w = torch.randn(8, 1)
y = X @ true_w + 0.1 * torch.randn(N_SAMPLES, 1)

dataset = TensorDataset(X, y)
loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True)

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
criterion = nn.MSELoss()
optimizer = torch.optim.Adam(model.parameters(), lr=LR)

for epoch in range(EPOCHS):
    running = 0.0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        pred = model(xb)
        loss = criterion(pred, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()
    print(f"epoch {epoch} loss {running / len(loader):.4f}")

torch.save(model.state_dict(), "regressor.pt")
print("done")
