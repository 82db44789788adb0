"""A DDP training run on CPU (gloo), profiled on every rank. Run with torchrun."""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import cirron as ci

ci.profile(path=sys.argv[1], output="spool")
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
ci.watch(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=4, sampler=sampler)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for inputs, labels in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        ci.mark("loss", loss.item())
dist.destroy_process_group()
