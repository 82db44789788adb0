"""A training step's cost with ``cirron watch`` attached, against the same run with none.

The MLP 3x512 step of :mod:`benchmarks.torch_steps` (batch 64, one torch thread, DataLoader
over in-memory tensors), profiled with the default settings (the spool and its index written
each second), runs in a fresh process; in one round of each pair a ``cirron watch --plain``
follows it from another process, as a user's second terminal would, refreshing each second.
The figure is the median wall time of a step (over blocks of steps), the rounds alternating
so that the machine's load falls on both alike. The watcher reads only what the run writes
anyway and talks to no one: the two should be the same, within the noise.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from .table import Row, half_iqr

STEPS = textwrap.dedent(
    """
    import statistics
    import sys
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import cirron as ci

    ci.profile()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        TensorDataset(torch.randn(64 * 8, 512), torch.randint(0, 10, (64 * 8,))), batch_size=64
    )
    blocks, block = int(sys.argv[1]), 20
    times = []
    done = 0
    began = time.perf_counter()
    while len(times) < blocks + 2:  # the first two blocks: warm-up
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            done += 1
            if done % block == 0:
                now = time.perf_counter()
                times.append((now - began) / block)
                began = now
    print(statistics.median(times[2:]) * 1e9)
    """
)


def _step_ns(blocks: int, watched: bool) -> tuple[float, float | None]:
    """The median step of one profiled run, with a watcher attached or not; and the
    watcher's CPU time over the run's wall time."""
    with tempfile.TemporaryDirectory() as folder:
        environment = {
            key: value for key, value in os.environ.items() if not key.startswith("CIRRON_")
        }
        watcher = None
        if watched:
            watcher = subprocess.Popen(
                [str(Path(sys.executable).parent / "cirron"), "watch", "--plain"],
                cwd=folder, env=environment, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        began = time.monotonic()
        try:
            result = subprocess.run(
                [sys.executable, "-c", STEPS, str(blocks)],
                cwd=folder, env=environment, capture_output=True, text=True, timeout=600,
                check=True,
            )  # fmt: skip
        finally:
            wall = time.monotonic() - began
            share = None
            if watcher is not None:  # its CPU: what the children reaped add when it is
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                watcher.terminate()
                watcher.wait(timeout=30)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                share = cpu / wall
        return float(result.stdout.strip().splitlines()[-1]), share


def run(quick: bool = False) -> list[Row]:
    import torch  # noqa: F401  (ImportError: the benchmark is skipped without torch)

    rounds, blocks = (1, 10) if quick else (7, 100)
    bare: list[float] = []
    watched: list[float] = []
    shares: list[float] = []
    for _ in range(rounds):
        bare.append(_step_ns(blocks, watched=False)[0])
        step, share = _step_ns(blocks, watched=True)
        watched.append(step)
        shares.append(100 * (share or 0.0))
    return [
        Row(
            "MLP 3x512 step, `cirron watch` attached",
            statistics.median(watched),
            "the same run, no watcher",
            statistics.median(bare),
            spread=half_iqr(watched),
            note="the profiled step with a watcher following the run from another process "
            "(refreshing each second), against the same run with none; rounds alternate",
        ),
        Row(
            "`cirron watch` CPU, of the run's wall time",
            statistics.median(shares),
            unit="%",
            spread=half_iqr(shares),
            note="the watcher's own CPU time (user and system) over the wall time of the run "
            "it followed, start-up included",
        ),
    ]
