"""How long a snapshot holds the training thread at an epoch boundary, vs the reference SDK.

One snippet, run under this package and under the reference SDK alike (see
:mod:`benchmarks.reference`): a stack of ``nn.Linear(1024, 1024)`` layers
(about 1M, 10M or 25M parameters, float32, on CPU, two torch threads) is
watched and trained over a DataLoader, two SGD steps per epoch, so every
boundary has weights and gradients. An SDK takes its snapshot somewhere in
the calls that end one pass and start the next (the fetch that finds the
loader exhausted, ``iter(loader)``, the first fetch of the new pass); the hold
is the wall time of those calls minus twice the median of the other fetches.
After its steps each epoch idles about as long as our snapshot thread needs
to finish (the rest of a real epoch); the figure is the median over six
boundaries. ``stats`` and ``sampled`` (``sample_rate=1.0``: raw tensors
written at every boundary) are measured separately, each in a fresh
interpreter, ours and the reference's back to back.

Short epochs are measured apart, on the 25M model in ``stats`` mode: epochs of
10 steps and of 1 step, back to back with no idle time, so the background work
of one boundary is still running at the next. There the median and the worst
hold are shown, and the share of boundaries that got a snapshot (ours skips a
model whose previous snapshot is still in flight rather than hold training for
it; the reference takes every one, synchronously).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from . import reference
from .table import Row, half_iqr

SIZES = {"1M": 1, "10M": 10, "25M": 24}  # layers of 1024x1024 (+bias): ~1.05M parameters each
_SNIPPET = """
import statistics, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import cirron as ci

torch.manual_seed(0)
torch.set_num_threads({threads})
model = nn.Sequential(*[nn.Linear({width}, {width}) for _ in range({layers})])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
loader = DataLoader(TensorDataset(torch.randn(2 * {steps}, {width})), batch_size=2)
ci.profile(snapshots={mode!r}, sample_rate=1.0, output="none", path="snapshot-bench")
ci.watch(model)
time.sleep({idle})  # as long as a script takes to get from watch() to training
boundaries, fetches, last = [], [], 0.0
for epoch in range({epochs}):
    started = time.perf_counter()
    iterator = iter(loader)
    (inputs,) = next(iterator)  # the pass and the fetch that start the epoch
    if epoch > 0:
        boundaries.append(last + time.perf_counter() - started)
    while True:
        optimizer.zero_grad()
        model(inputs).sum().backward()
        optimizer.step()
        started = time.perf_counter()
        try:
            (inputs,) = next(iterator)
        except StopIteration:  # the fetch that finds the loader exhausted
            last = time.perf_counter() - started
            break
        fetches.append(time.perf_counter() - started)
    time.sleep({idle})  # the rest of the epoch
normal = statistics.median(fetches) if fetches else 0.0
skipped = ci.health().get("snapshots_skipped")  # ours only; the reference takes every one
ci.shutdown()
report({{"holds_ms": [(b - 2 * normal) * 1e3 for b in boundaries], "skipped": skipped}})
"""


def measure(
    layers: int,
    mode: str,
    python: str | None,
    quick: bool,
    steps: int = 2,
    idle: bool = True,
    epochs: int = 7,
) -> dict[str, Any]:
    """``holds_ms`` per boundary and ``skipped`` snapshots, under ``python`` (None: ours)."""
    code = reference.REPORT_FUNCTION + _SNIPPET.format(
        threads=2,
        width=64 if quick else 1024,
        layers=layers,
        mode=mode,
        steps=steps,
        epochs=3 if quick else epochs,
        # Long enough for our background thread to finish the last snapshot (the files of a
        # sampled one take ~1 s for 25M parameters here), as the rest of a real epoch would be.
        idle=0.0
        if not idle
        else 0.05
        if quick
        else layers * (0.1 if mode == "sampled" else 0.05) + 0.3,
    )
    return reference.run_snippet(code, python)  # type: ignore[no-any-return]


def run(quick: bool = False) -> list[Row]:
    """Rows of ours and the reference's hold in ms (no baseline of our own: the reference is it)."""
    import torch  # noqa: F401 - ImportError: the caller skips these rows

    python = reference.reference_python()
    sizes = {"tiny": 2} if quick else SIZES
    rows = []
    for mode in ("stats", "sampled"):
        for label, layers in sizes.items():
            ours, spread = _median_hold(layers, mode, None, quick)
            theirs = _median_hold(layers, mode, python, quick)[0] if python else None
            name = f"snapshot hold, {mode}, {label} params"
            rows.append(Row(name, ours, unit="ms", reference=theirs, spread=spread))
    layers = 2 if quick else SIZES["25M"]
    for steps in (10, 1):
        rows += _short_epochs(layers, steps, python, quick)
    return rows


def _short_epochs(layers: int, steps: int, python: str | None, quick: bool) -> list[Row]:
    """Rows for back-to-back epochs of ``steps`` steps: median and worst hold, snapshots taken."""
    epochs = 12 if steps > 1 else 30
    ours = measure(layers, "stats", None, quick, steps=steps, idle=False, epochs=epochs)
    theirs = (
        measure(layers, "stats", python, quick, steps=steps, idle=False, epochs=epochs)
        if python
        else None
    )
    label = "tiny" if quick else "25M"
    holds, their_holds = ours["holds_ms"], theirs["holds_ms"] if theirs else None
    boundaries = 3 if quick else epochs  # the last one at shutdown
    taken = 100.0 * (boundaries - (ours["skipped"] or 0)) / boundaries
    return [
        Row(
            f"snapshot hold, stats, {label}, {steps}-step epochs",
            statistics.median(holds),
            unit="ms",
            reference=statistics.median(their_holds) if their_holds else None,
            spread=half_iqr(holds),
        ),
        Row(
            "  worst boundary",
            max(holds),
            unit="ms",
            reference=max(their_holds) if their_holds else None,
        ),
        Row("  boundaries with a snapshot", taken, unit="%", reference=100.0 if theirs else None),
    ]


def _median_hold(
    layers: int, mode: str, python: str | None, quick: bool
) -> tuple[float, float | None]:
    """The median hold over the boundaries of one run, and its spread."""
    holds = measure(layers, mode, python, quick)["holds_ms"]
    # The files a sampled run wrote are deleted with its directory, but the kernel may still
    # be writing them back: let it finish before the next measurement.
    os.sync()
    return statistics.median(holds), half_iqr(holds)
