"""How long a snapshot holds the training thread at an epoch boundary, vs the reference SDK.

One snippet, run under this package and under the reference SDK alike (see
:mod:`benchmarks.reference`): a stack of ``nn.Linear(1024, 1024)`` layers
(about 1M, 10M or 25M parameters, float32, on CPU) is watched and trained
over a DataLoader, two SGD steps per epoch, so every boundary has weights
and gradients. An SDK takes the snapshot inside the fetch that starts the
next epoch (or in starting that pass, or in the fetch that finds the loader
exhausted); the hold is the wall time of all that minus twice the median of
the other fetches. After its steps each epoch idles a while, as the rest of a real epoch
would (the snapshot thread finishes meanwhile); the figure is the median over
the measured boundaries. ``stats`` and ``sampled`` (``sample_rate=1.0``: raw
tensors written at every boundary) are measured separately, each run in a
fresh interpreter.
"""

from __future__ import annotations

import statistics

from . import reference

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
loader = DataLoader(TensorDataset(torch.randn(4, {width})), batch_size=2)
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
normal = statistics.median(fetches)
ci.shutdown()
report({{"holds_ms": [(b - 2 * normal) * 1e3 for b in boundaries]}})
"""


def measure(layers: int, mode: str, python: str | None, quick: bool) -> list[float]:
    """Hold per boundary in ms, under ``python`` (None: this package)."""
    code = reference.REPORT_FUNCTION + _SNIPPET.format(
        threads=2,
        width=64 if quick else 1024,
        layers=layers,
        mode=mode,
        epochs=3 if quick else 5,
        idle=0.05 if quick else max(0.5, layers * 0.06),
    )
    return reference.run_snippet(code, python)["holds_ms"]  # type: ignore[no-any-return]


def run(quick: bool = False) -> list[tuple[str, float, str, float, str]]:
    """Table rows: (operation, ours, baseline name, the reference's or 0 when absent, "ms")."""
    import torch  # noqa: F401 - ImportError: the caller skips these rows

    python = reference.reference_python()
    baseline = f"reference SDK {reference.VERSION}" if python else "reference: not installed"
    sizes = {"tiny": 2} if quick else SIZES
    rows = []
    for label, layers in sizes.items():
        for mode in ("stats", "sampled"):
            ours = statistics.median(measure(layers, mode, None, quick))
            theirs = statistics.median(measure(layers, mode, python, quick)) if python else 0.0
            rows.append((f"snapshot hold, {mode}, {label} params", ours, baseline, theirs, "ms"))
    return rows
