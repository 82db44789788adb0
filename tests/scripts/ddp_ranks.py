"""A DDP run on CPU (gloo) with one rank made slow, for the straggler view. Run with torchrun.

``--slow-rank R --slow-in data|forward|optimizer --slow-ms M``: rank R's DataLoader sleeps M
ms per batch, or its model's forward (or its optimizer step) computes M ms longer. ``--no-profile`` runs it without cirron;
``--dump FILE`` writes each rank's losses, final gradients and weights (as hex) to
``FILE.<rank>.json``, to compare runs bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("path")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-in", choices=("data", "forward", "optimizer"), default="data")
parser.add_argument("--slow-ms", type=float, default=40.0)
parser.add_argument("--no-profile", action="store_true")
parser.add_argument("--dump")
arguments = parser.parse_args()
BATCH = 4
rank = int(os.environ["RANK"])
slow = rank == arguments.slow_rank

if not arguments.no_profile:
    import cirron as ci

    ci.profile(path=arguments.path, output="spool")
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")


class Data(Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(
            arguments.steps * BATCH * dist.get_world_size(), 32, generator=generator
        )
        self.y = torch.randint(0, 4, (len(self.x),), generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if slow and arguments.slow_in == "data":
            time.sleep(arguments.slow_ms / 1000 / BATCH)
        return self.x[index], self.y[index]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if slow and arguments.slow_in == "forward":
            end = time.perf_counter() + arguments.slow_ms / 1000
            while time.perf_counter() < end:
                pass
        return self.layers(x)


model = DistributedDataParallel(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if slow and arguments.slow_in == "optimizer":  # inside optimizer.step, before it updates

    def busy(*_arguments: object) -> None:
        end = time.perf_counter() + arguments.slow_ms / 1000
        while time.perf_counter() < end:
            pass

    optimizer.register_step_pre_hook(busy)
data = Data()
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
losses = []
for inputs, labels in loader:
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
if arguments.dump:
    dumped = {
        "losses": [value.hex() for value in losses],
        "gradients": [p.grad.numpy().tobytes().hex() for p in model.parameters()],
        "weights": [p.detach().numpy().tobytes().hex() for p in model.parameters()],
    }
    with open(f"{arguments.dump}.{rank}.json", "w") as file:
        json.dump(dumped, file)
dist.barrier()  # every rank done before any tears the group down
dist.destroy_process_group()
if not arguments.no_profile:
    ci.shutdown()
# Out without C++ static destructors: gloo's threads at interpreter exit now and then abort a
# rank ("terminate called without an active exception"), with or without cirron.
os._exit(0)
