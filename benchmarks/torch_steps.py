"""Per-step cost of the torch hooks: bare vs instrumented, in interleaved rounds.

- MLP 3x512, batch 64, one torch thread, DataLoader over in-memory tensors:
  the relative overhead of every hook (data_load, step, forward, loss,
  backward, optimizer_step) on a small but real step.
- A 400-module model vs a 4-module model: the added time per step must not
  grow with the number of submodules (only the outermost call is a span).
  That time is noisy (the deep model's step is mostly Python), so the same
  claim is also counted exactly: the Python and C calls the hooks add to a
  step (``sys.setprofile``), for both models and for the MLP step.

:func:`measure` runs in fresh processes under this package and under the
reference SDK alike (:func:`benchmarks.reference.call_snippet`), ours and the
reference's alternating; both install their torch hooks on ``ci.profile``
and remove them on ``ci.shutdown``, which is what the pairs need.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import cirron as ci

from . import reference
from .table import Row, half_iqr


def _loader_loop(model: Any, inputs: Any, labels: Any, batch: int) -> Callable[[int], None]:
    """``run(steps)``: SGD steps of ``model`` over a DataLoader of the data, as many as asked."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=batch)

    def run(steps: int) -> None:
        done = 0
        while done < steps:
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break

    return run


def _mlp_case() -> Callable[[int], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    return _loader_loop(model, torch.randn(64 * 8, 512), torch.randint(0, 10, (64 * 8,)), 64)


def _conv_case() -> Callable[[int], None]:
    """A realistic step: a small conv net on 32x32 images, batch 32 (15-25 ms on one thread)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    images = torch.randn(32 * 8, 3, 32, 32)
    return _loader_loop(model, images, torch.randint(0, 10, (32 * 8,)), 32)


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
    cases: dict[str, Callable[[int], None]],
    steps: int,
    rounds: int,
    steps_of: dict[str, int] | None = None,
) -> dict[str, tuple[list[float], list[float]]]:
    """Per case: (bare ns/step samples, instrumented ns/step samples).

    ``steps_of``: fewer steps a half for a case whose steps are long.

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
                    ci.profile(output="none", frameworks=["torch"])
                case(2)  # the first steps after profile() pay for first calls
                samples[name][instrumented].append(_time(case, (steps_of or {}).get(name, steps)))
            ci.shutdown()
    return samples


def measure(steps: int, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """Pairs of (bare, instrumented) ns per step for each case; runs in a subprocess."""
    import torch

    torch.set_num_threads(1)
    cases = {
        "mlp": _mlp_case(),
        "deep400": _deep_case(200),
        "deep4": _deep_case(2),
        "conv": _conv_case(),
    }
    for case in cases.values():  # warm-up: allocator, first-call paths
        case(5)
    # The conv step is ~8x the MLP's, and its pairs vary by 2 % of a step: 16 steps a half
    # (of the MLP's 40) resolve the tenths of a percent its target is about.
    return _interleaved(cases, steps, rounds, {"conv": max(2, steps * 2 // 5)})


def _calls_per_step(case: Callable[[int], None], steps: int = 10) -> float:
    """Python function calls plus C function calls made per step (``sys.setprofile`` sees both)."""
    calls = 0

    def count(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    sys.setprofile(count)
    try:
        case(steps)
    finally:
        sys.setprofile(None)
    return calls / steps


def count_calls() -> dict[str, list[float]]:
    """Per case: [calls per step bare, calls per step instrumented]; runs in a subprocess."""
    import torch

    torch.set_num_threads(1)
    cases = {"mlp": _mlp_case(), "deep400": _deep_case(200), "deep4": _deep_case(2)}
    counts: dict[str, list[float]] = {}
    for name, case in cases.items():
        case(5)
        ci.shutdown()
        bare = _calls_per_step(case)
        ci.profile(output="none", frameworks=["torch"])
        case(5)  # past the first step's one-off calls (the epoch, first lookups)
        counts[name] = [bare, _calls_per_step(case)]
        ci.shutdown()
    return counts


class _Figures:
    """Medians over every pair of every process of one SDK."""

    def __init__(self, results: list[dict[str, list[list[float]]]]) -> None:
        self.pairs: dict[str, list[tuple[float, float]]] = {}
        for result in results:
            for name, (bare, instrumented) in result.items():
                self.pairs.setdefault(name, []).extend(zip(bare, instrumented, strict=True))

    def bare(self, name: str) -> float:
        return statistics.median(off for off, _ in self.pairs[name])

    def added(self, name: str) -> float:
        return statistics.median(on - off for off, on in self.pairs[name])

    def spread(self, name: str) -> float | None:
        """Half the interquartile range of the added time over pairs."""
        return half_iqr(on - off for off, on in self.pairs[name])


def run(quick: bool = False) -> list[Row]:
    """The MLP step, the share the hooks add to it, and the added time on a deep model."""
    import torch  # noqa: F401 - ImportError: the caller skips these rows

    # Full: 30 pairs per case and SDK, in 2 processes each, ours and the reference's alternating.
    steps, rounds, runs = (20, 2, 1) if quick else (40, 15, 2)
    code = reference.call_snippet("torch_steps", "measure", steps=steps, rounds=rounds)
    ours_results, reference_results = reference.run_both(code, runs)
    ours = _Figures(ours_results)
    theirs = _Figures(reference_results) if reference_results else None
    # Deterministic: one process per SDK is enough.
    ours_calls, reference_calls = reference.run_both(
        reference.call_snippet("torch_steps", "count_calls"), 1
    )

    def calls_added(counts: list[dict[str, list[float]]] | None, name: str) -> float | None:
        if not counts:
            return None
        bare, instrumented = counts[0][name]
        return instrumented - bare

    def step(figures: _Figures, name: str = "mlp") -> float:
        return figures.bare(name) + figures.added(name)

    def share(figures: _Figures, name: str = "mlp") -> float:
        return 100 * figures.added(name) / figures.bare(name)

    return [
        Row(
            "MLP 3x512 step",
            step(ours),
            "same step, no hooks",
            ours.bare("mlp"),
            "us",
            step(theirs) if theirs else None,
            spread=ours.spread("mlp"),
        ),
        Row(
            "  added by the hooks",
            share(ours),
            "",
            None,
            "%",
            share(theirs) if theirs else None,
            spread=100 * (ours.spread("mlp") or 0.0) / ours.bare("mlp"),
        ),
        Row(
            "conv net step (10-50 ms)",
            step(ours, "conv"),
            "same step, no hooks",
            ours.bare("conv"),
            "us",
            step(theirs, "conv") if theirs else None,
            spread=ours.spread("conv"),
        ),
        Row(
            "  added by the hooks",
            share(ours, "conv"),
            "",
            None,
            "%",
            share(theirs, "conv") if theirs else None,
            spread=100 * (ours.spread("conv") or 0.0) / ours.bare("conv"),
        ),
        Row(
            "added per step, 401 modules",
            ours.added("deep400"),
            "added per step, 5 modules",
            ours.added("deep4"),
            "us",
            theirs.added("deep400") if theirs else None,
            spread=ours.spread("deep400"),
        ),
        Row(
            "calls added per MLP step",
            calls_added(ours_calls, "mlp") or 0.0,
            "calls per step, no hooks",
            ours_calls[0]["mlp"][0] if ours_calls else None,
            "calls",
            calls_added(reference_calls, "mlp"),
        ),
        Row(
            "calls added per step, 401 modules",
            calls_added(ours_calls, "deep400") or 0.0,
            "calls added, 5 modules",
            calls_added(ours_calls, "deep4"),
            "calls",
            calls_added(reference_calls, "deep400"),
        ),
    ]
