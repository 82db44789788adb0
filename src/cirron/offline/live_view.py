"""How ``cirron watch`` draws a run's figures (:mod:`cirron.offline.live_figures`): a rich
view for a terminal, one plain line a refresh without one, and the final summary.

The rich view is a few blocks, each kept to one line a row so a small window still shows
the top of it: the run, the step time by part as a bar, the marks with a sparkline each,
the memory, CPU and GPU, a line per rank with the slowest one highlighted, and the
findings with their next action.
"""

from __future__ import annotations

import math
import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..exporters.lines import format_duration, format_value
from ..otel import semconv
from .live_figures import SHOWN_PARTS, Figures
from .steps import OTHER

PART_STYLES = {
    semconv.DATA_LOAD: "red",
    semconv.FORWARD: "green",
    semconv.BACKWARD: "blue",
    semconv.OPTIMIZER_STEP: "magenta",
    OTHER: "bright_black",
}
PART_NAMES = {semconv.DATA_LOAD: "data", semconv.OPTIMIZER_STEP: "optimizer"}
SPARKS = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 40
SPARK_WIDTH = 30
MARKS_SHOWN = 6
FINDINGS_SHOWN = 5
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def part_name(part: str) -> str:
    return PART_NAMES.get(part, part)


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """``values`` (the last ``width`` buckets of them, each bucket's mean) as block
    characters from the lowest to the highest; a non-finite value is a ``!``."""
    if not values:
        return ""
    size = max(1, math.ceil(len(values) / width))
    buckets = [values[at : at + size] for at in range(0, len(values), size)][-width:]
    means = [
        sum(bucket) / len(bucket) if all(math.isfinite(v) for v in bucket) else math.nan
        for bucket in buckets
    ]
    finite = [m for m in means if math.isfinite(m)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    spread = high - low
    if spread <= 1e-9 * max(abs(low), abs(high)):  # the same value (a mean rounds): flat
        spread = 0.0
    return "".join(
        "!"
        if not math.isfinite(m)
        else SPARKS[int((m - low) / spread * (len(SPARKS) - 1)) if spread else 0]
        for m in means
    )


def heading(figures: Figures) -> str:
    """One line: the run, its framework(s), processes, time, steps, pace and time left."""
    pace = f" · {figures.steps_per_s:.1f} steps/s" if figures.steps_per_s else ""
    pace += progress(figures)
    state = f" · {figures.ended}" if figures.ended else " · running"
    # (the index lines say the open session's frameworks, the session its own at the end)
    frameworks = f" · {', '.join(figures.frameworks)}" if figures.frameworks else ""
    return (
        f"run {figures.id[:16]}{frameworks} · {', '.join(figures.processes)} · "
        f"{format_duration(figures.elapsed_ns)} · {figures.steps:,} steps{pace}{state}"
    )


def progress(figures: Figures) -> str:
    """`` · time left ~12m (step 340 of 1,000)``, or ``(epoch 2 of 5)`` for a run planned
    in epochs; no time left before the pace (or, in epochs, an epoch's steps) is known, and
    nothing where the run's length is not."""
    if figures.max_steps and figures.total_steps:
        where = f"step {figures.done:,} of {figures.total_steps:,}"
    elif figures.max_epochs and figures.epoch:
        where = f"epoch {figures.epoch} of {figures.max_epochs}"
    else:
        return ""
    left = f"time left {time_left(figures.left_ns)} " if figures.left_ns is not None else ""
    return f" · {left}({where})"


def time_left(nanoseconds: int) -> str:
    """A time left as a person says it, about: ``<1s``, ``~45s``, ``~12m``, ``~3h 20m``,
    ``~2d 5h``."""
    seconds = round(nanoseconds / 1e9)
    if seconds < 1:
        return "<1s"
    if seconds < 60:
        return f"~{seconds}s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"~{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"~{hours}h {minutes}m" if minutes else f"~{hours}h"
    days, hours = divmod(hours, 24)
    return f"~{days}d {hours}h" if hours else f"~{days}d"


def step_line(figures: Figures) -> str:
    if figures.median_ns is None:
        return "no steps yet"
    share = f" · input-bound {figures.input_share:.0%}" if figures.input_share is not None else ""
    each = " of each rank" if len(figures.ranks) > 1 else ""
    return (
        f"step {format_duration(figures.median_ns)} median / "
        f"{format_duration(figures.p95_ns)} p95 (the last {figures.window} steps{each}){share}"
    )


def _bar(figures: Figures) -> Text:
    total = sum(figures.parts_ns.values())
    bar = Text()
    if not total:
        return bar
    for part in SHOWN_PARTS:
        cells = round(figures.parts_ns[part] / total * BAR_WIDTH)
        bar.append("█" * cells, style=PART_STYLES[part])
    bar.append("  ")
    for part in SHOWN_PARTS:
        if figures.parts_ns[part]:
            bar.append("■ ", style=PART_STYLES[part])
            bar.append(
                f"{part_name(part)} {format_duration(figures.parts_ns[part])} "
                f"({figures.parts_ns[part] / total:.0%})  "
            )
    return bar


def _resources(figures: Figures) -> str:
    said = [f"{label} {_bytes(value)}" for label, value in figures.memory.items()]
    if figures.cpu is not None:
        said.append(f"{figures.cpu_of} CPU {figures.cpu:.0%}")
    if figures.gpu:
        said.append("GPU " + " ".join(f"{value:.0%}" for value in figures.gpu))
    return " · ".join(said)


def _bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f}{unit}" if unit in ("B", "KB") else f"{count:.1f}{unit}"
        count /= 1024
    raise AssertionError("unreachable")


def view(figures: Figures, path: str) -> RenderableType:
    """The rich view of ``figures`` (of the run in ``path``)."""
    blocks: list[RenderableType] = [
        Text(heading(figures), style="bold"),
        Text(step_line(figures)),
        _bar(figures),
    ]
    if figures.marks:
        marks = Table.grid(padding=(0, 2))
        for name, values in list(figures.marks.items())[:MARKS_SHOWN]:
            marks.add_row(name, format_value(values[-1]) if values else "", sparkline(values))
        blocks.append(marks)
    resources = _resources(figures)
    if resources:
        blocks.append(Text(resources))
    if len(figures.ranks) > 1:
        ranks = Table("rank", "steps", "median step", *map(part_name, SHOWN_PARTS), box=None)
        slowest = figures.slowest.split(" (")[0] if figures.slowest else None
        for rank in figures.ranks:
            ranks.add_row(
                rank.label,
                f"{rank.steps:,}",
                format_duration(rank.median_ns),
                *(format_duration(rank.parts_ns[part]) for part in SHOWN_PARTS),
                style="bold red" if rank.label == slowest else None,
            )
        blocks.append(ranks)
        if figures.slowest:
            blocks.append(Text(f"slowest: {figures.slowest}", style="bold red"))
    for finding in figures.findings[:FINDINGS_SHOWN]:
        line = Text(f"{finding.severity:<8}", style=SEVERITY_STYLES.get(finding.severity, ""))
        line.append(f" {finding.text}")
        if finding.action:
            line.append(f"\n{'':<8} next: {finding.action}", style="dim")
        blocks.append(line)
    if not figures.ended:
        blocks.append(Text(f"watching {path} · Ctrl-C stops watching (the run goes on)", "dim"))
    return Group(*blocks)


def plain_line(figures: Figures) -> str:
    """One line a refresh, without a terminal: the heading, the step time and its parts."""
    total = sum(figures.parts_ns.values())
    parts = (
        " · " + " ".join(
            f"{part_name(p)} {figures.parts_ns[p] / total:.0%}"
            for p in SHOWN_PARTS if figures.parts_ns[p]
        )
        if total
        else ""
    )  # fmt: skip
    marks = "".join(
        f" · {name} {format_value(values[-1])}"
        for name, values in list(figures.marks.items())[:MARKS_SHOWN]
        if values
    )
    slowest = f" · slowest {figures.slowest}" if figures.slowest else ""
    return (
        f"{time.strftime('%H:%M:%S')} {heading(figures)} · {step_line(figures)}{parts}"
        f"{marks}{slowest}"
    )


def summary(figures: Figures, path: str) -> str:
    """The run's summary when it ended: its figures, the findings with their next action,
    and where to read more."""
    lines = [heading(figures), step_line(figures)]
    total = sum(figures.parts_ns.values())
    if total:
        lines.append(
            "step time by part: "
            + ", ".join(
                f"{part_name(p)} {format_duration(figures.parts_ns[p])} "
                f"({figures.parts_ns[p] / total:.0%})"
                for p in SHOWN_PARTS
                if figures.parts_ns[p]
            )
        )
    for name, values in list(figures.marks.items())[:MARKS_SHOWN]:
        if values:
            lines.append(f"{name}: {format_value(values[-1])}  {sparkline(values)}")
    if figures.slowest:
        lines.append(f"slowest rank: {figures.slowest}")
    for finding in figures.findings[:FINDINGS_SHOWN]:
        lines.append(f"{finding.severity:<8} {finding.text}")
        if finding.action:
            lines.append(f"{'':<8} next: {finding.action}")
    lines.append(
        f"the spool: {path} · more: `cirron show {path} --diagnose`, "
        f"`cirron report {path} -o report.html`"
    )
    return "\n".join(lines)
