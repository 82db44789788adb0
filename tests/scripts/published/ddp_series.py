"""A trainer in the shape of PyTorch's DDP tutorial series: a ``Trainer`` class that runs
epochs of batches, peeks at the loader for its batch size at the top of each epoch, and
saves a checkpoint every few epochs. ``--distributed``: the torchrun version (gloo, a
``DistributedSampler`` whose epoch is set each epoch, checkpoints from rank 0 only).

Implied: 2 epochs of 8 steps (256 samples, batches of 32, per process).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

DISTRIBUTED = "--distributed" in sys.argv


class RandomPairs(Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.items = [
            (torch.rand(20, generator=generator), torch.rand(1, generator=generator))
            for _ in range(size)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


class Trainer:
    def __init__(self, model, loader, optimizer, rank: int, save_every: int) -> None:
        self.rank = rank
        self.model = model
        if DISTRIBUTED:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(model)
        self.loader = loader
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        batch_size = len(next(iter(self.loader))[0])
        print(
            f"[rank {self.rank}] epoch {epoch} | batch size {batch_size} | steps {len(self.loader)}"
        )
        if DISTRIBUTED:
            self.loader.sampler.set_epoch(epoch)
        for source, targets in self.loader:
            self._run_batch(source, targets)

    def _save_checkpoint(self, epoch: int) -> None:
        state = self.model.module.state_dict() if DISTRIBUTED else self.model.state_dict()
        torch.save(state, "checkpoint.pt")
        print(f"epoch {epoch}: checkpoint saved")

    def train(self, max_epochs: int) -> None:
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def main(total_epochs: int, save_every: int, batch_size: int) -> None:
    rank = 0
    if DISTRIBUTED:
        from torch.distributed import init_process_group

        init_process_group(backend="gloo")
        rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    dataset = RandomPairs(256 * (2 if DISTRIBUTED else 1))
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if DISTRIBUTED:
        from torch.utils.data.distributed import DistributedSampler

        loader = DataLoader(
            dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
        )
    else:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    Trainer(model, loader, optimizer, rank, save_every).train(total_epochs)
    if DISTRIBUTED:
        from torch.distributed import destroy_process_group

        destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(total_epochs=2, save_every=1, batch_size=32)
