"""The report's charts of what the steps cost the machine: memory per step (the process's
resident memory, and on CUDA the allocator's peak during the step) and how busy the
training thread was (its CPU time over the step's wall time), each with the epochs'
boundaries drawn, so a creep from epoch to epoch shows as a staircase."""

from __future__ import annotations

import math
from typing import Any

from ..otel import semconv
from .charts import Chart, Charted, add_line, plotly, points_each
from .steps import Timeline

MB = 1 << 20
MEMORY = (  # (attribute, what a line of it is called)
    (semconv.PROCESS_MEMORY_USAGE, "host RSS"),
    (semconv.CUDA_MEMORY_PEAK_ALLOCATED, "CUDA peak allocated"),
    (semconv.CUDA_MEMORY_PEAK_RESERVED, "CUDA peak reserved"),
)


def resource_charts(charted: Charted) -> list[Chart]:
    """Memory per step and the training thread's CPU share per step (x: step number)."""
    go = plotly()
    memory, cpu = go.Figure(), go.Figure()
    drawn_memory = drawn_cpu = False
    several = len(charted.timelines) > 1
    limit = points_each(len(charted.timelines) * len(MEMORY))
    epochs: set[float] = set()  # where epochs begin, in any process (ranks share them)
    for name, timeline in charted.timelines:
        prefix = f"{name}: " if several else ""
        for attribute, what in MEMORY:
            points = _series(timeline, attribute)
            if points:
                values: list[float | None] = [y / MB for _, y in points]
                add_line(memory, [x for x, _ in points], values, prefix + what, limit)
                drawn_memory = True
        shares = [
            (step.number, 100 * value / step.wall_ns)
            for step in timeline.steps
            if step.wall_ns and isinstance(value := _attribute(step.span, semconv.CPU_NS), int)
        ]
        if shares:
            percents: list[float | None] = [y for _, y in shares]
            add_line(cpu, [x for x, _ in shares], percents, prefix + "training thread", limit)
            drawn_cpu = True
        epochs.update(
            step.number - 0.5
            for step in timeline.steps
            if step.first_of_epoch and step.number and step.epoch is not None
        )
    _epoch_lines(memory, sorted(epochs))
    _epoch_lines(cpu, sorted(epochs))
    cadence = _cadence(charted)
    memory.update_layout(xaxis_title=semconv.STEP, yaxis_title="MB")
    cpu.update_layout(xaxis_title=semconv.STEP, yaxis_title="% of the step on the CPU")
    charts = []
    if drawn_memory:
        charts.append(
            Chart(
                "resources",
                "Memory per step",
                memory,
                "The process's resident memory at each step's end; on CUDA, the most the "
                "allocator held during the step. Dotted lines: where epochs begin. " + cadence,
            )
        )
    if drawn_cpu:
        charts.append(
            Chart(
                "cpu",
                "Training thread's CPU per step",
                cpu,
                "Its CPU time over the step's wall time: near 100 % the thread computed all "
                "along; low, it waited (for data, the device, I/O or a lock). " + cadence,
            )
        )
    return charts


def _cadence(charted: Charted) -> str:
    """How many steps carry the figures, and why not all: a short run shows only a few dots."""
    steps = [step for _, timeline in charted.timelines for step in timeline.steps]
    measured = sum(isinstance(_attribute(s.span, semconv.CPU_NS), int) for s in steps)
    return (
        f"Measured on {measured:,} of {len(steps):,} steps: steps are measured on a cadence, one "
        "every step_resources_interval (CIRRON_STEP_RESOURCES_INTERVAL, 0.1 s by default) and "
        "every step longer than that, so a short run of short steps has a few points only."
    )


def _attribute(span: Any, name: str) -> Any:
    value = (span.attributes or {}).get(name)
    return None if isinstance(value, bool) else value


def _series(timeline: Timeline, attribute: str) -> list[tuple[int, int]]:
    return [
        (step.number, value)
        for step in timeline.steps
        if isinstance(value := _attribute(step.span, attribute), int)
    ]


MAX_EPOCH_LINES = 200  # more would hide the chart: every k-th epoch's line, past that


def _epoch_lines(figure: Any, starts: list[float]) -> None:
    """A dotted line where each epoch begins, as one list of shapes set once: plotly's
    ``add_vline`` copies every shape before it (a thousand epochs took minutes), and so does
    setting them again for each process (64 ranks: minutes again)."""
    every = max(1, math.ceil(len(starts) / MAX_EPOCH_LINES))
    shapes = [
        {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
         "line": {"dash": "dot", "color": "#999"}}
        for x in starts[::every]
    ]  # fmt: skip
    if shapes:
        figure.update_layout(shapes=shapes)
