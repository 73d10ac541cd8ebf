"""Distributed by Horovod: `horovodrun -np 4 python horovod_train.py`."""
import horovod.torch as hvd
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

hvd.init()
torch.manual_seed(0)
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank())
dataset = TensorDataset(torch.randn(256, 10), torch.randint(0, 3, (256,)))
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
model = nn.Linear(10, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    if hvd.rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")
