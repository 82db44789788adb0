"""Sine-wave prediction in the shape of PyTorch's time-sequence example: two LSTM cells,
trained with LBFGS through a closure for a few steps, each step followed by a prediction
of the future under ``torch.no_grad()`` (the model stays in train mode). No DataLoader.

Implied: 3 steps (one per ``optimizer.step(closure)``), each with the closure's forwards
and backwards inside; the predictions are evaluation forwards outside every step.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


class Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 16)
        self.lstm2 = nn.LSTMCell(16, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, signal, future: int = 0):
        outputs = []
        h_t = torch.zeros(signal.size(0), 16, dtype=torch.double)
        c_t = torch.zeros(signal.size(0), 16, dtype=torch.double)
        h_t2 = torch.zeros(signal.size(0), 16, dtype=torch.double)
        c_t2 = torch.zeros(signal.size(0), 16, dtype=torch.double)
        for value in signal.split(1, dim=1):
            h_t, c_t = self.lstm1(value, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs.append(output)
        for _ in range(future):  # predicting the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs.append(output)
        return torch.cat(outputs, dim=1)


def sine_waves(count: int = 12, length: int = 40) -> np.ndarray:
    rng = np.random.default_rng(2)
    offsets = np.arange(length) + rng.integers(-20, 20, count).reshape(count, 1)
    return np.sin(offsets / 4.0).astype("float64")


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = sine_waves()
    train_input = torch.from_numpy(data[3:, :-1])
    train_target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    model = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=4)
    for step in range(3):
        print("STEP:", step)

        def closure():
            optimizer.zero_grad()
            loss = criterion(model(train_input), train_target)
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            future = 10
            prediction = model(test_input, future=future)
            loss = criterion(prediction[:, :-future], test_target)
            print("test loss:", loss.item())
