"""What metrics cost: a point mark with metrics on against off, and the sampler thread's share.

- **Mark**: ``ci.mark("loss", 0.5)`` inside a scope, 1,000 a scope, with the default
  sinks (the spool), ``metrics=True`` against ``metrics=False`` in the same
  process, rounds of the two alternating (a profiler started and shut down around each
  round, untimed). The row is the calling thread's CPU time per mark, as
  ``benchmarks/hot_path.py`` measures it: metrics are derived on a sink thread, so this
  is what training pays (target: at most 1.5x). The sub-row is the whole process's CPU
  per mark until ``ci.flush()`` returned, so the sink thread's deriving and the SDK's
  recording (one histogram record per mark and metric reader, with its exemplar) count:
  what the machine pays, and what a loop that holds the interpreter (pure Python) feels
  in its wall time, since the sink thread shares the interpreter.
- **Sampler**: the system sampler thread at 1 s, its own CPU time
  (``time.thread_time_ns`` on that thread) over the wall time, in percent of one core
  (target: at most 0.5 %).

Each runs in a fresh subprocess of our interpreter (the reference SDK has no metrics).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from . import reference
from .table import Row, half_iqr

MARKS_PER_SCOPE = 1000


def _marks(n: int) -> None:
    import cirron as ci

    mark = ci.mark
    for _ in range(n // MARKS_PER_SCOPE):
        with ci.scope("marks"):
            for _ in range(MARKS_PER_SCOPE):
                mark("loss", 0.5)


def _round(metrics: bool, n: int) -> tuple[float, float]:
    """(calling-thread ns per mark, process ns per mark until the flush returned)."""
    import cirron as ci

    ci.profile(frameworks=[], metrics=metrics)  # the default sinks: the spool
    _marks(MARKS_PER_SCOPE)  # warm: the first mark makes the instrument
    ci.flush()
    process, thread = time.process_time_ns(), time.thread_time_ns()
    _marks(n)
    thread = time.thread_time_ns() - thread
    ci.flush()
    process = time.process_time_ns() - process
    ci.shutdown()
    return thread / n, process / n


def measure_marks(n: int, rounds: int) -> dict[str, Any]:
    """Per round, for metrics on and off: the calling thread's and the process's ns per mark."""
    found: dict[str, list[float]] = {"on": [], "off": [], "on_process": [], "off_process": []}
    for _ in range(rounds):
        for metrics, key in ((False, "off"), (True, "on")):
            thread, process = _round(metrics, n)
            found[key].append(thread)
            found[key + "_process"].append(process)
    return found


def measure_sampler(seconds: float) -> dict[str, Any]:
    """The sampler thread at 1 s for ``seconds``: its CPU time and how many samples it took."""
    from cirron.metrics.sampler import SystemSampler
    from cirron.otel.health import Health

    sampler = SystemSampler(1.0, lambda sample: None, Health())
    started = time.monotonic()
    sampler.start()
    while sampler.samples < 1:  # the first: importing psutil, looking for GPUs
        time.sleep(0.001)
    time.sleep(0.01)
    first = sampler.cpu_ns
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    sampler.stop(2.0)
    wall = time.monotonic() - started
    return {
        "cpu_ns": sampler.cpu_ns,
        "first_ns": first,
        "wall_s": wall,
        "samples": sampler.samples,
        "source": sampler.process.source if sampler.process else "",
    }


def run(quick: bool = False) -> list[Row]:
    n, rounds = (5_000, 3) if quick else (50_000, 9)
    marks = reference.run_snippet(
        reference.call_snippet("metrics", "measure_marks", n=n, rounds=rounds)
    )
    sampler = reference.run_snippet(
        reference.call_snippet("metrics", "measure_sampler", seconds=3.0 if quick else 10.0)
    )
    share = 100.0 * sampler["cpu_ns"] / (sampler["wall_s"] * 1e9)
    steady = (sampler["cpu_ns"] - sampler["first_ns"]) / max(1, sampler["samples"] - 1)
    return [
        Row(
            "ci.mark point, metrics on",
            statistics.median(marks["on"]),
            "metrics off",
            statistics.median(marks["off"]),
            "us",
            spread=half_iqr(marks["on"]),
            note="the training thread's CPU per mark; metrics are derived on a sink thread "
            "(target <= 1.5x metrics off); the sub-row counts that thread too",
        ),
        Row(
            "  its process CPU, flush included",
            statistics.median(marks["on_process"]),
            "metrics off",
            statistics.median(marks["off_process"]),
            "us",
            spread=half_iqr(marks["on_process"]),
        ),
        Row(
            "metrics sampler at 1 s",
            share,
            "target",
            0.5,
            "%",
            note=f"{sampler['samples']} samples ({sampler['source']}) in "
            f"{sampler['wall_s']:.1f} s, {sampler['cpu_ns'] / 1e6:.2f} ms of its thread's CPU, "
            f"of which the first sample (imports, looking for GPUs) "
            f"{sampler['first_ns'] / 1e6:.2f} ms; each later one {steady / 1e3:.0f} us",
        ),
    ]
