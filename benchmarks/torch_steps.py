"""Per-step cost of the torch hooks: bare vs instrumented, in interleaved rounds.

- MLP 3x512, batch 64, one torch thread, DataLoader over in-memory tensors:
  the relative overhead of every hook (data_load, step, forward, loss,
  backward, optimizer_step) on a small but real step.
- A 400-module model vs a 4-module model: the added time per step must not
  grow with the number of submodules (only the outermost call is a span).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import cirron as ci


def _mlp_case() -> Callable[[int], None]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = TensorDataset(torch.randn(64 * 8, 512), torch.randint(0, 10, (64 * 8,)))
    loader = DataLoader(data, batch_size=64)

    def run(steps: int) -> None:
        done = 0
        while done < steps:
            for inputs, labels in loader:
                optimizer.zero_grad()
                loss_fn(model(inputs), labels).backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break

    return run


def _deep_case(blocks: int) -> Callable[[int], None]:
    """``blocks`` tiny Linear+ReLU pairs inside one Sequential: 2*blocks+1 modules."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(blocks):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(4, 8)

    def run(steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            model(inputs).sum().backward()
            optimizer.step()

    return run


def _time(case: Callable[[int], None], steps: int) -> float:
    started = time.thread_time_ns()
    case(steps)
    return (time.thread_time_ns() - started) / steps


def _interleaved(
    cases: dict[str, Callable[[int], None]], steps: int, rounds: int, directory: str
) -> dict[str, tuple[list[float], list[float]]]:
    """Per case: (bare ns/step samples, instrumented ns/step samples).

    Many short pairs, bare and instrumented back to back in alternating order,
    so the machine's drift (a noisy neighbour, frequency changes) hits both
    halves of a pair alike; the figure is the median over pairs.
    """
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in cases}
    for round_index in range(rounds):
        for name, case in cases.items():
            for instrumented in (False, True) if round_index % 2 else (True, False):
                ci.shutdown()
                if instrumented:
                    ci.profile(output="none", path=directory, frameworks=["torch"])
                case(2)  # the first steps after profile() pay for first calls
                samples[name][instrumented].append(_time(case, steps))
            ci.shutdown()
    return samples


def run(quick: bool = False) -> list[tuple[str, float, str, float]]:
    import torch

    torch.set_num_threads(1)
    steps, rounds = (20, 2) if quick else (40, 60)
    cases = {"mlp": _mlp_case(), "deep400": _deep_case(200), "deep4": _deep_case(2)}
    for case in cases.values():  # warm-up: allocator, first-call paths
        case(5)
    with tempfile.TemporaryDirectory() as directory:
        samples = _interleaved(cases, steps, rounds, directory)

    def median(name: str, which: int) -> float:
        return statistics.median(samples[name][which])

    def added(name: str) -> float:
        return statistics.median(
            [on - off for off, on in zip(samples[name][0], samples[name][1], strict=True)]
        )

    return [
        (
            "MLP 3x512 step",
            median("mlp", 0) + added("mlp"),
            "same step, no hooks",
            median("mlp", 0),
        ),
        (
            "added per step, 401 modules",
            added("deep400"),
            "added per step, 5 modules",
            added("deep4"),
        ),
    ]
