"""A language model trained with Lightning Fabric, in the shape of Fabric's examples: the
model, optimizer and loaders set up by Fabric, ``fabric.backward`` and gradient clipping,
a validation function under no_grad in eval mode after every epoch.

Implied: 2 epochs of 6 steps, a validation pass of 2 batches in each epoch; the forwards
named after the user's model, not Fabric's wrapper.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class RandomText(Dataset):
    def __init__(self, samples: int, length: int = 12, vocab: int = 40, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (samples, length + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int):
        return self.tokens[index, :-1], self.tokens[index, 1:]


class LanguageModel(nn.Module):
    def __init__(self, vocab: int = 40, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        hidden, _ = self.rnn(self.embed(tokens))
        return F.log_softmax(self.head(hidden), dim=-1)


@torch.no_grad()
def validate(fabric: L.Fabric, model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    losses = []
    for tokens, targets in loader:
        output = model(tokens)
        losses.append(F.nll_loss(output.flatten(0, 1), targets.flatten()))
    model.train()
    return torch.stack(losses).mean().item()


def main() -> None:
    fabric = L.Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    fabric.seed_everything(42)
    train = DataLoader(RandomText(48), batch_size=8, shuffle=True)
    validation = DataLoader(RandomText(16, seed=1), batch_size=8)
    train, validation = fabric.setup_dataloaders(train, validation)
    model = LanguageModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer = fabric.setup(model, optimizer)
    for epoch in range(2):
        for iteration, (tokens, targets) in enumerate(train):
            output = model(tokens)
            loss = F.nll_loss(output.flatten(0, 1), targets.flatten())
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, clip_val=0.25)
            optimizer.step()
            optimizer.zero_grad()
            if iteration % 3 == 0:
                fabric.print(f"epoch {epoch} iteration {iteration} loss {loss.item():.3f}")
        fabric.print(f"epoch {epoch} validation loss {validate(fabric, model, validation):.3f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
