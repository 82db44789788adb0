"""The summary of a run, printed by the training process on stderr when it ends.

A few lines to read at the end of the output, or to paste into an issue::

    [cirron] run summary: 1,200 steps in 2m31s · step 125ms median / 141ms p95
    [cirron]   step time by part: data 98.0ms (78%), forward 9.1ms (7%), backward 14.2ms (11%), ...
    [cirron]   warning: 78% of step time is spent waiting for data: the run is input-bound.
    [cirron]     next: more DataLoader workers (num_workers), pin_memory=True on a GPU, ...
    [cirron]   the spool: .cirron · more: cirron show .cirron --diagnose

Made from what the metrics already hold (:class:`cirron.metrics.instruments.Instruments`:
the steps' summed time by part and their count, the recent step durations, the marks'
non-finite values), not from the spool: it costs a few milliseconds at exit. The findings
are the ones those figures tell, at the thresholds of ``cirron show --diagnose``; the
command it names says the rest.

The ``run_summary`` setting (``CIRRON_RUN_SUMMARY``) turns it on or off; unset, it is on
when stderr is a terminal and the run writes somewhere (``output`` other than ``"none"``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from ..exporters.console import PREFIX
from ..exporters.lines import format_duration, format_value
from ..otel import semconv
from .instruments import Instruments

OTHER = "other"
PARTS = (*semconv.STEP_PARTS, OTHER)
PART_NAMES = {semconv.DATA_LOAD: "data", semconv.OPTIMIZER_STEP: "optimizer"}
# As ``cirron show --diagnose`` says them (cirron.offline.step_findings, where the same
# thresholds are named: a test checks they agree).
INPUT_BOUND = 0.2
SLOW_FACTOR = 3.0


def wanted(setting: bool | None, output: tuple[str, ...], stream: TextIO | None) -> bool:
    """Whether to print the summary: the setting, else on for a terminal when the run
    writes somewhere."""
    if setting is not None:
        return setting
    if not output or stream is None:  # (output="none" leaves no sink)
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or foreign stream
        return False


def _parts(instruments: Instruments) -> dict[str, float]:
    """Seconds of step time by part, over the whole run."""
    found: dict[str, float] = {}
    for value, attributes in instruments.totals(semconv.STEP_TIME):
        part = attributes.get(semconv.STEP_PART)
        if isinstance(part, str):
            found[part] = found.get(part, 0.0) + float(value)
    return found


def _durations(instruments: Instruments) -> list[float]:
    """The step durations ``ci.metrics()`` still holds (the recent ones), in seconds."""
    values = instruments.recorded.values()
    return [value for name, value in values if name == semconv.STEP_DURATION]


def lines(instruments: Instruments, elapsed_ns: int | None, path: str | None) -> list[str]:
    """The summary's lines (without the prefix)."""
    steps = int(sum(value for value, _attributes in instruments.totals(semconv.STEP_COUNT)))
    durations = sorted(_durations(instruments))
    head = f"run summary: {steps:,} step{'' if steps == 1 else 's'}"
    if elapsed_ns:
        head += f" in {format_duration(elapsed_ns)}"
    if durations:
        # Not statistics.median: this module is imported at exit, and statistics defines a
        # named tuple (see Profiler._print_summary).
        middle = len(durations) // 2
        median = (
            durations[middle] if len(durations) % 2 else sum(durations[middle - 1 : middle + 1]) / 2
        )
        p95 = durations[min(len(durations) - 1, int(0.95 * len(durations)))]
        head += f" · step {_seconds(median)} median / {_seconds(p95)} p95"
    said = [head]
    marks = last_marks(instruments)
    if marks:
        said.append(f"  last marks: {format_marks(marks)}")
    parts = _parts(instruments)
    total = sum(parts.values())
    if total > 0:
        said.append(
            "  step time by part: "
            + ", ".join(
                f"{PART_NAMES.get(part, part)} {_seconds(parts[part] / max(steps, 1))} "
                f"({parts[part] / total:.0%})"
                for part in PARTS
                if parts.get(part)
            )
        )
    said += _findings(parts, total, durations, median, instruments.non_finite)
    if path is not None:
        said.append(f"  the spool: {path} · more: cirron show {path} --diagnose")
    return said


def _seconds(value: float) -> str:
    return format_duration(int(value * 1e9))


def _findings(
    parts: Mapping[str, float],
    total: float,
    durations: list[float],
    median: float | None,
    non_finite: Mapping[str, int],
) -> list[str]:
    said = []
    for mark, count in non_finite.items():
        said += [
            f"  error: {mark} was not finite (NaN or inf) {count} time{'s' if count > 1 else ''}.",
            "    next: lower the learning rate, or look for the first such step with "
            "`cirron show --diagnose`",
        ]
    share = parts.get(semconv.DATA_LOAD, 0.0) / total if total else 0.0
    if share >= INPUT_BOUND:
        said += [
            f"  warning: {share:.0%} of step time is spent waiting for data: the run is "
            "input-bound.",
            "    next: feed the loop faster: more DataLoader workers (num_workers), "
            "pin_memory=True on a GPU, persistent_workers=True",
        ]
    if median:
        slow = [d for d in durations if d > SLOW_FACTOR * median and d - median > 1e-3]
        if slow:
            said += [
                f"  warning: {len(slow)} of the last {len(durations):,} steps took over "
                f"{SLOW_FACTOR:g}x the median ({_seconds(max(slow))} the slowest).",
                "    next: `cirron show --diagnose` names them and what ran in them",
            ]
    return said


def print_summary(
    instruments: Instruments,
    elapsed_ns: int | None,
    path: str | None,
    stream: TextIO | None = None,
) -> None:
    """Write the summary to ``stream`` (stderr)."""
    stream = stream if stream is not None else sys.stderr
    if stream is None:
        return
    text = "".join(f"{PREFIX}{line}\n" for line in lines(instruments, elapsed_ns, path))
    stream.write(text)
    stream.flush()


def last_marks(instruments: Instruments) -> dict[str, Any]:
    """The last value of each mark (by its name), from what ``ci.metrics()`` holds."""
    names = {name: mark for mark, name in instruments.marks.items()}
    found: dict[str, Any] = {}
    for name, value in instruments.recorded.values():
        if name in names and isinstance(value, int | float):
            found[names[name]] = value
    return {mark: value for mark, value in found.items() if math.isfinite(value)}


def format_marks(marks: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {format_value(value)}" for name, value in marks.items())
