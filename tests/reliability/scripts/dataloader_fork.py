"""A profiled torch loop over a DataLoader with two forked workers.

python dataloader_fork.py PATH
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import cirron as ci

ci.profile(path=sys.argv[1], flush_interval=0.05)
print(f"PID {os.getpid()}", flush=True)

data = TensorDataset(torch.arange(64, dtype=torch.float32).reshape(32, 2), torch.arange(32))
loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

seen = 0
for _epoch in ci.epochs(range(2)):
    for x, y in ci.batches(loader):
        loss = (model(x).squeeze(1) - y.float()).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ci.mark("loss", loss.item())
        seen += len(y)

print(f"SEEN {seen}", flush=True)
ci.shutdown()
print("DONE", flush=True)
