"""Two runs side by side (``cirron compare A B``, and the report of two runs): what a user
checks after every change.

For each run, over the steps of all its processes: the step time and each part's
(:data:`cirron.offline.ranks.PARTS`: data wait, forward, backward compute, communication
wait, optimizer, other), median and p95; throughput (steps per second, from each process's
first step to its last, the median process; samples per second where the run marked its
batch size, ``ci.mark("batch_size", n)`` with each rank's batch); the input-bound share (the
steps' wait for data over their wall time); memory peaks (the most resident memory at a
step's end, and on CUDA the allocator's highest step peak); and the first and last value of
the training loss. Each figure of B is also given as a ratio to A's.

B is *slower* than A by how much its median step exceeds A's; ``--threshold`` turns that
into an exit status for CI.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ..exporters.lines import format_duration, format_value
from ..otel import semconv
from .findings import loss_series
from .ranks import PARTS, WORDS, p95, step_parts
from .resource_findings import megabytes
from .runs import Run
from .steps import Timeline

BATCH_SIZE_MARK = "batch_size"  # the mark a run gives its batch size with (each rank's)


class NothingToCompare(Exception):
    """A run has no steps: there is nothing to compare."""


@dataclass
class Summary:
    """One run's figures: what :func:`compare` puts side by side."""

    label: str  # how the run is named in the output: "A", "B"
    run: Run
    steps: int
    step: tuple[float, float]  # median and p95 of a step's wall time, ns
    parts: dict[str, tuple[float, float]]  # the same, per part
    steps_per_s: float
    samples_per_s: float | None
    input_share: float | None  # None: the steps record no wait for data
    host_peak: int | None  # bytes
    cuda_peak: int | None
    loss: tuple[str, float, float] | None  # (the mark, its first value, its last)


def summarize(label: str, run: Run) -> Summary:
    """``run``'s figures; :class:`NothingToCompare` when it recorded no steps."""
    timelines = [process.timeline() for process in run.processes]
    with_steps = [timeline for timeline in timelines if timeline.steps]
    if not with_steps:
        raise NothingToCompare(f"run {label} ({run.id[:12]}) recorded no steps: nothing to compare")
    parts = [step_parts(t, step) for t in with_steps for step in t.steps]
    walls = [int(sum(p.values())) for p in parts]
    rates = [_steps_per_s(timeline) for timeline in with_steps]
    steps_per_s = statistics.median(rates)
    batch = _batch_size(with_steps)
    return Summary(
        label,
        run,
        len(walls),
        (float(statistics.median(walls)), p95(walls)),
        {
            part: (float(statistics.median(p[part] for p in parts)), p95([p[part] for p in parts]))
            for part in PARTS
        },
        steps_per_s,
        steps_per_s * batch * len(with_steps) if batch else None,
        _input_share(with_steps),
        _peak(with_steps, semconv.PROCESS_MEMORY_USAGE),
        _peak(with_steps, semconv.CUDA_MEMORY_PEAK_ALLOCATED),
        _loss(with_steps[0]),
    )


def _steps_per_s(timeline: Timeline) -> float:
    first, last = timeline.steps[0].span, timeline.steps[-1].span
    wall = (last.end_time or last.start_time) - first.start_time
    return len(timeline.steps) / (wall / 1e9) if wall > 0 else 0.0


def _input_share(timelines: list[Timeline]) -> float | None:
    measured = [(t, s) for t in timelines for s in t.steps if t.measures_waiting(s)]
    if not measured:
        return None
    wall = sum(step.wall_ns for _t, step in measured)
    return sum(t.waiting_ns(s) for t, s in measured) / wall if wall else 0.0


def _peak(timelines: list[Timeline], attribute: str) -> int | None:
    values = [
        value
        for timeline in timelines
        for step in timeline.steps
        if isinstance(value := (step.span.attributes or {}).get(attribute), int)
        and not isinstance(value, bool)
    ]
    return max(values) if values else None


def _batch_size(timelines: list[Timeline]) -> float | None:
    """The last ``batch_size`` mark of the run (a point or a summary mark), if any."""
    found: list[tuple[int, float]] = []
    summary_key = semconv.MARK_PREFIX + BATCH_SIZE_MARK
    for timeline in timelines:
        for span in timeline.spans:
            size = _size((span.attributes or {}).get(summary_key))
            if size is not None:
                found.append((span.start_time, size))
            for event in span.events:
                size = _size((event.attributes or {}).get(semconv.MARK_VALUE))
                if event.name == BATCH_SIZE_MARK and size is not None:
                    found.append((event.timestamp, size))
    return max(found)[1] if found else None


def _size(value: Any) -> float | None:
    """``value`` as a batch size: a finite number over 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _loss(timeline: Timeline) -> tuple[str, float, float] | None:
    found = loss_series(timeline)
    if found is None or not found[1]:
        return None
    name, values = found
    return name, values[0], values[-1]


# -- side by side --------------------------------------------------------------------------------
@dataclass
class Line:
    """One figure of both runs: its name, A's, B's, their unit and B's ratio to A's."""

    figure: str
    a: float | None
    b: float | None
    unit: str  # "ns", "rate" (per second), "share", "bytes", "" (a loss)

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.unit == "share":
            return None
        if self.a == 0:
            return 1.0 if self.b == 0 else None
        return self.b / self.a


def lines(a: Summary, b: Summary) -> list[Line]:
    """The figures of A and B, in the order the table shows them."""
    found = [
        Line("step, median", a.step[0], b.step[0], "ns"),
        Line("step, p95", a.step[1], b.step[1], "ns"),
    ]
    for part in PARTS:
        if not (a.parts[part][1] or b.parts[part][1]):
            continue  # a part neither run has (no collectives on one process)
        found.append(Line(f"{WORDS[part]}, median", a.parts[part][0], b.parts[part][0], "ns"))
        found.append(Line(f"{WORDS[part]}, p95", a.parts[part][1], b.parts[part][1], "ns"))
    found += [
        Line("steps/s", a.steps_per_s, b.steps_per_s, "rate"),
        Line("samples/s", a.samples_per_s, b.samples_per_s, "rate"),
        Line("input-bound share", a.input_share, b.input_share, "share"),
        Line("host memory peak", _float(a.host_peak), _float(b.host_peak), "bytes"),
        Line("CUDA peak allocated", _float(a.cuda_peak), _float(b.cuda_peak), "bytes"),
    ]
    name = (a.loss or b.loss or ("loss",))[0]
    found.append(Line(f"{name}, first", _loss_at(a, 1), _loss_at(b, 1), ""))
    found.append(Line(f"{name}, last", _loss_at(a, 2), _loss_at(b, 2), ""))
    return [line for line in found if line.a is not None or line.b is not None]


def _float(value: int | None) -> float | None:
    return float(value) if value is not None else None


def _loss_at(summary: Summary, position: int) -> float | None:
    """The first (``position`` 1) or last (2) value of the run's loss."""
    loss = summary.loss
    if loss is None:
        return None
    return loss[1] if position == 1 else loss[2]


def slower_by(a: Summary, b: Summary) -> float:
    """How much slower B's median step is than A's (0.2: 20 % slower; negative: faster)."""
    return b.step[0] / a.step[0] - 1 if a.step[0] else 0.0


# -- what it prints ----------------------------------------------------------------------------
def shown(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ns":
        return format_duration(int(value))
    if unit == "share":
        return f"{value:.0%}"
    if unit == "bytes":
        return megabytes(value)
    if unit == "rate":
        return f"{value:.3g}"
    return format_value(value)


def ratio_text(line: Line) -> str:
    if line.unit == "share" and line.a is not None and line.b is not None:
        # From the shares as shown (rounded), so that "2% 1%" reads "-1 pts", never "-0 pts".
        return f"{round(100 * line.b) - round(100 * line.a):+d} pts"
    ratio = line.ratio
    return f"{ratio:.2f}" if ratio is not None else "-"


def heading(summary: Summary, where: str) -> str:
    run = summary.run
    processes = ", ".join(process.label for process in run.processes)
    return (
        f"{summary.label}: run {run.id[:16]} ({where}) · {', '.join(run.frameworks) or 'no framework'}"
        f" · {processes} · {summary.steps} steps"
    )


def text(a: Summary, b: Summary, where: tuple[str, str]) -> str:
    """The comparison as a table, B's ratio to A's in the last column."""
    out = [heading(a, where[0]), heading(b, where[1]), ""]
    out.append(f"{'':<28}{'A':>14}{'B':>14}{'B/A':>10}")
    for line in lines(a, b):
        out.append(
            f"{line.figure:<28}{shown(line.a, line.unit):>14}{shown(line.b, line.unit):>14}"
            f"{ratio_text(line):>10}"
        )
    return "\n".join(out)


def verdict(a: Summary, b: Summary, threshold: float | None) -> tuple[str, bool]:
    """One sentence on B's speed against A's, and whether it is over ``threshold``."""
    by = slower_by(a, b)
    over = threshold is not None and by > threshold
    if by > 0:
        said = f"B is {by:.1%} slower than A at the median step"
    elif by < 0:
        said = f"B is {-by:.1%} faster than A at the median step"
    else:
        said = "B is as fast as A at the median step"
    if threshold is None:
        pass
    elif by <= 0:  # (a faster B is not "within" a limit on slowing down: it passed)
        said += f": passed, not slower (the {threshold:.0%} threshold limits a slowdown)"
    else:
        said += f": {'over' if over else 'within'} the {threshold:.0%} threshold"
    return said + ".", over


def as_json(
    a: Summary, b: Summary, where: tuple[str, str], threshold: float | None
) -> dict[str, Any]:
    said, over = verdict(a, b, threshold)
    return {
        "a": _run_json(a, where[0]),
        "b": _run_json(b, where[1]),
        "figures": [
            {
                "figure": line.figure,
                "unit": line.unit,
                "a": line.a,
                "b": line.b,
                "ratio": line.ratio,
            }
            for line in lines(a, b)
        ],
        "slower_by": slower_by(a, b),
        "threshold": threshold,
        "over_threshold": over,
        "verdict": said,
    }


def _run_json(summary: Summary, where: str) -> dict[str, Any]:
    return {
        "run": summary.run.id,
        "where": where,
        "processes": [process.label for process in summary.run.processes],
        "step_count": summary.steps,
    }
