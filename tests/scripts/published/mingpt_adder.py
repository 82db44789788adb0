"""Learning to add two-digit numbers in the shape of minGPT's adder project: a trainer that
draws batches forever (a sampler with replacement, the iterator made anew when it runs
dry), clips gradients, stops at ``max_iters``, and a batch-end callback that every few
iterations scores the model on the train and test splits in eval mode under no_grad.

Implied: one epoch (the loader never runs dry) of 30 steps, and 2 evaluation passes
(train split, test split) at each of iterations 10, 20 and 30.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.sampler import RandomSampler


class AdditionDataset(Dataset):
    """Sequences "a b" -> "a+b" of two-digit numbers, as digit tokens."""

    def __init__(self, split: str) -> None:
        generator = torch.Generator().manual_seed(1337)
        permutation = torch.randperm(100 * 100, generator=generator)
        test = permutation[:200]
        self.indexes = test if split == "test" else permutation[200:1200]

    def __len__(self) -> int:
        return len(self.indexes)

    def __getitem__(self, index: int):
        number = int(self.indexes[index])
        a, b = number // 100, number % 100
        digits = f"{a:02d}{b:02d}{a + b:03d}"[::1]
        tokens = torch.tensor([int(d) for d in digits], dtype=torch.long)
        return tokens[:-1], tokens[1:]


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 10, width: int = 32, length: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(1, length, width))
        layer = nn.TransformerEncoderLayer(width, 2, 64, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, tokens, targets=None):
        hidden = self.embed(tokens) + self.position[:, : tokens.size(1)]
        logits = self.head(self.blocks(hidden, mask=self.mask, is_causal=True))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


class Trainer:
    def __init__(self, model, dataset, max_iters: int, batch_size: int) -> None:
        self.model, self.dataset = model, dataset
        self.max_iters, self.batch_size = max_iters, batch_size
        self.callbacks: list = []
        self.iter_num = 0
        self.loss = None

    def run(self) -> None:
        model = self.model
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
        loader = DataLoader(
            self.dataset,
            sampler=RandomSampler(self.dataset, replacement=True, num_samples=int(1e10)),
            shuffle=False,
            batch_size=self.batch_size,
        )
        model.train()
        data_iter = iter(loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(loader)
                batch = next(data_iter)
            tokens, targets = batch
            _logits, self.loss = model(tokens, targets)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            self.iter_num += 1
            for callback in self.callbacks:
                callback(self)
            if self.iter_num >= self.max_iters:
                break


@torch.no_grad()
def eval_split(model, dataset) -> float:
    loader = DataLoader(dataset, batch_size=100, num_workers=0, drop_last=False)
    correct = 0
    for tokens, targets in loader:
        logits, _ = model(tokens)
        correct += (logits[:, -3:].argmax(-1) == targets[:, -3:]).all(-1).sum().item()
    return correct / len(dataset)


if __name__ == "__main__":
    torch.manual_seed(3407)
    torch.set_num_threads(1)
    train, test = AdditionDataset("train"), AdditionDataset("test")
    model = TinyGPT()
    trainer = Trainer(model, train, max_iters=30, batch_size=32)

    def batch_end_callback(trainer: Trainer) -> None:
        if trainer.iter_num % 10 == 0:
            model.eval()
            train_score, test_score = eval_split(model, train), eval_split(model, test)
            print(
                f"iter {trainer.iter_num}: loss {trainer.loss.item():.3f} "
                f"train {train_score:.3f} test {test_score:.3f}"
            )
            model.train()

    trainer.callbacks.append(batch_end_callback)
    trainer.run()
