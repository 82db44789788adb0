"""The report's charts as plotly figures: what :mod:`cirron.offline.report` lays out.

Every chart reads each process's :class:`~cirron.offline.steps.Timeline`:

- steps are numbered across the run (``Step.number``), whatever the framework numbers
  them (a Keras batch index restarts each epoch, the x axis does not);
- a point mark is drawn at the step it was recorded in, and a mark series with values
  outside any step (an evaluation's) by its order instead;
- a step's parts count each interval once (a ``forward`` nested in ``optimizer_step`` is
  forward time, not optimizer time too);
- snapshots (:mod:`cirron.offline.snapshot_charts`) are per epoch: of many tensors only the :data:`TOP_TENSORS` whose norm changed
  most are drawn, a NaN or Inf is a gap in its line and a red cross, never a norm of 0.

Plotly reads a subset of HTML in titles, legends, tick labels and hover labels; every name
a user chose (a mark's, a tensor's, a run id) reaches it through :func:`plot_text`, so it
shows as the text it is. Long names are cut to :data:`LABEL_LENGTH` characters in legends
and keep their full text in the hover label.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..otel import semconv
from . import step_findings
from .runs import Run
from .steps import OTHER, Timeline, is_error

# A longer series is cut into this many buckets, each drawn as its median inside a band from
# its lowest to its highest value: a chart of a million steps weighs what one of 2,000 does.
MAX_POINTS = 2000
# Points of all the lines of one chart together: 64 ranks get 125 buckets a line, not 2,000
# (the chart would weigh 9 MB), and never fewer than MIN_POINTS.
CHART_POINTS = 8000
MIN_POINTS = 100


def points_each(lines: int) -> int:
    """The buckets each of ``lines`` lines of one chart may have."""
    return max(MIN_POINTS, min(MAX_POINTS, CHART_POINTS // max(lines, 1)))


TOP_TENSORS = 8  # norm lines drawn per chart
LABEL_LENGTH = 40  # characters of a name in a legend or on an axis
COLORS = {  # one color per part in every process's bars
    semconv.DATA_LOAD: "#636efa",
    semconv.FORWARD: "#ef553b",
    semconv.BACKWARD: "#00cc96",
    semconv.OPTIMIZER_STEP: "#ab63fa",
    OTHER: "#ffa15a",
}
NON_FINITE_COLOR = "#d62728"
SLOW_COLOR = "#ff7f0e"
ERROR_COLOR = "#8b0000"


class Charted:
    """The processes of the runs a report shows, each with its label and timeline."""

    def __init__(self, chosen: list[Run]) -> None:
        several = len(chosen) > 1
        self.timelines: list[tuple[str, Timeline]] = [
            ((f"run {run.id[:8]} " if several else "") + process.label, process.timeline())
            for run in chosen
            for process in run.processes
        ]
        self.spans = [span for run in chosen for span in run.spans]
        self.span_count = sum(run.span_count for run in chosen)  # read or not


@dataclass
class Chart:
    id: str  # the anchor findings link to
    title: str  # plain text: the report escapes it
    figure: Any
    note: str = ""  # plain text under the title


def plot_text(text: Any) -> str:
    """``text`` as plotly shows it literally (plotly reads ``<b>``, ``<a href>``, ``&...;``)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def shorten(text: Any, limit: int = LABEL_LENGTH) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def label(text: Any) -> str:
    """A name for a legend or an axis: shortened, then made literal."""
    return plot_text(shorten(text))


def plotly() -> Any:
    import plotly.graph_objects as go

    return go


def finite(value: Any) -> float | None:
    """``value`` as a float, None if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


Buckets = tuple[list[Any], list[float | None], list[float | None], list[float | None]]


def downsample(xs: list[Any], ys: list[float | None], limit: int = MAX_POINTS) -> Buckets:
    """At most ``limit`` buckets of consecutive points: (each bucket's first x, its median,
    its lowest and its highest value); a bucket of no finite value is None in each."""
    size = max(1, math.ceil(len(xs) / limit))
    out_x: list[Any] = []
    medians: list[float | None] = []
    lows: list[float | None] = []
    highs: list[float | None] = []
    for start in range(0, len(xs), size):
        values = sorted(y for y in ys[start : start + size] if y is not None)
        out_x.append(xs[start])
        medians.append(statistics.median(values) if values else None)
        lows.append(values[0] if values else None)
        highs.append(values[-1] if values else None)
    return out_x, medians, lows, highs


def add_line(
    figure: Any, xs: list[Any], ys: list[float | None], name: str, limit: int = MAX_POINTS
) -> None:
    """A line of ``ys``; past ``limit`` points, the buckets' medians inside a band from each
    bucket's lowest to its highest value, so a spike stays in sight."""
    if len(xs) <= limit:
        figure.add_scatter(
            x=xs,
            y=ys,
            mode="lines+markers" if len(xs) <= 100 else "lines",
            name=label(name),
            hovertext=plot_text(name),
            hoverinfo="x+y+text",
        )
        return
    dx, medians, lows, highs = downsample(xs, ys, limit)
    group = f"band {name}"
    figure.add_scatter(
        x=dx, y=highs, mode="lines", line={"width": 0}, legendgroup=group, showlegend=False,
        hovertext=plot_text(f"{name}: highest of {len(xs) // len(dx)}"), hoverinfo="x+y+text",
    )  # fmt: skip
    figure.add_scatter(
        x=dx, y=lows, mode="lines", line={"width": 0}, fill="tonexty", legendgroup=group,
        name=label(f"{name} (lowest to highest)"),
        hovertext=plot_text(f"{name}: lowest"), hoverinfo="x+y+text",
    )  # fmt: skip
    figure.add_scatter(
        x=dx, y=medians, mode="lines", name=label(f"{name} (median)"),
        hovertext=plot_text(f"{name}: median"), hoverinfo="x+y+text",
    )  # fmt: skip


def mark_points(figure: Any, xs: list[Any], ys: list[float], name: str, color: str) -> None:
    """The points ``xs``/``ys`` as markers of their own (steps a finding names)."""
    if xs:
        figure.add_scatter(
            x=xs, y=ys, mode="markers", name=label(name), hovertext=plot_text(name),
            hoverinfo="x+y+text", marker={"size": 8, "color": color, "symbol": "circle-open"},
        )  # fmt: skip


def mark_non_finite(figure: Any, points: list[tuple[Any, str]]) -> None:
    """A red cross at the foot of the chart at each x of ``points`` ((x, hover text))."""
    if not points:
        return
    figure.add_scatter(
        x=[x for x, _text in points],
        y=[0.03] * len(points),
        yaxis="y2",
        mode="markers",
        marker={"symbol": "x", "size": 10, "color": NON_FINITE_COLOR},
        name="NaN / Inf",
        hovertext=[plot_text(text) for _x, text in points],
        hoverinfo="x+text",
    )
    figure.update_layout(yaxis2={"overlaying": "y", "range": [0, 1], "visible": False})


def whole_numbers(figure: Any, xs: list[Any]) -> None:
    """Ticks on whole numbers only (epochs): plotly puts a tick at 0.5 on a short axis."""
    numbers = [x for x in xs if isinstance(x, int)]
    if numbers:
        figure.update_xaxes(dtick=max(1, math.ceil((max(numbers) - min(numbers)) / 10)))


def epoch_index(epoch: Any, fallback: Any) -> Any:
    if epoch is None:
        return fallback
    return (epoch.attributes or {}).get(semconv.INDEX, fallback)


# -- steps --------------------------------------------------------------------------------------
def step_charts(charted: Charted) -> list[Chart]:
    """Step time and data-load stall per step (x: the step's number in the run), and the
    step time of each epoch by part."""
    go = plotly()
    step_times, stalls = go.Figure(), go.Figure()
    limit = points_each(sum(1 for _name, timeline in charted.timelines if timeline.steps))
    for name, timeline in charted.timelines:
        if not timeline.steps:
            continue
        xs = [step.number for step in timeline.steps]
        walls: list[float | None] = [step.wall_ns / 1e6 for step in timeline.steps]
        shares: list[float | None] = [
            100 * timeline.waiting_ns(step) / step.wall_ns if step.wall_ns else 0.0
            for step in timeline.steps
        ]
        add_line(step_times, xs, walls, name, limit)
        add_line(stalls, xs, shares, name, limit)
        # The steps the findings name stay points of their own, however the line is cut.
        slow = {n for f in step_findings.slow_steps("", timeline) for n in f.figures["slow_steps"]}
        failed = {step.number for step in timeline.steps if is_error(step.span)}
        for numbers, what, color in ((slow, "slow", SLOW_COLOR), (failed, "failed", ERROR_COLOR)):
            chosen = [step for step in timeline.steps if step.number in numbers]
            mark_points(step_times, [s.number for s in chosen], [s.wall_ns / 1e6 for s in chosen],
                        f"{name}: {what} steps", color)  # fmt: skip
    step_times.update_layout(xaxis_title=semconv.STEP, yaxis_title="ms")
    stalls.update_layout(xaxis_title=semconv.STEP, yaxis_title="% of the step waiting for data")
    return [
        Chart("step-times", "Step time per process", step_times),
        Chart("stalls", "Data-load stall per step", stalls),
        _breakdown(charted),
    ]


def _parts_per_epoch(timeline: Timeline) -> dict[Any, dict[str, float]]:
    """epoch index -> part -> ms, summed over the epoch's steps."""
    per_epoch: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for step in timeline.steps:
        key = epoch_index(step.epoch, "none")
        for part, ns in timeline.parts(step).items():
            per_epoch[key][part] += ns / 1e6
    return per_epoch


def _breakdown(charted: Charted) -> Chart:
    figure = plotly().Figure()
    several = len(charted.timelines) > 1
    legend = True
    for name, timeline in charted.timelines:
        per_epoch = _parts_per_epoch(timeline)
        if not per_epoch:
            continue
        prefix = f"{shorten(name)} " if several else ""
        categories = [plot_text(f"{prefix}epoch {key}") for key in per_epoch]
        for part in (*semconv.STEP_PARTS, OTHER):
            figure.add_bar(
                x=categories,
                y=[parts[part] for parts in per_epoch.values()],
                name=part,
                legendgroup=part,
                marker_color=COLORS[part],
                showlegend=legend,
            )
        legend = False
    figure.update_layout(barmode="stack", yaxis_title="ms (sum over the epoch's steps)")
    parts = ", ".join((*semconv.STEP_PARTS, OTHER))
    return Chart(
        "breakdown",
        "Step time by part, per epoch",
        figure,
        f"Each step's time split into {parts}; a part nested in another counts once.",
    )


# -- marks --------------------------------------------------------------------------------------
MarkPoint = tuple[int, int | None, float | None]  # (time ns, step number, value)


def _mark_series(charted: Charted) -> dict[str, dict[str, list[MarkPoint]]]:
    """mark name -> process label -> its numeric point marks, in time order."""
    series: dict[str, dict[str, list[MarkPoint]]] = defaultdict(lambda: defaultdict(list))
    for name, timeline in charted.timelines:
        for span in timeline.spans:
            for event in span.events:
                value = (event.attributes or {}).get(semconv.MARK_VALUE)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    step = timeline.step_at(span, event.timestamp)
                    number = step.number if step is not None else None
                    series[event.name][name].append((event.timestamp, number, finite(value)))
    for by_process in series.values():
        for points in by_process.values():
            points.sort(key=lambda point: point[0])
    return series


def mark_charts(charted: Charted) -> list[Chart]:
    """One chart per point mark, a line per process: at the step each value was recorded in,
    or (a mark with values outside any step) in the order they came."""
    go = plotly()
    charts = []
    for number, (mark, by_process) in enumerate(sorted(_mark_series(charted).items())):
        on_steps = all(p[1] is not None for points in by_process.values() for p in points)
        figure = go.Figure()
        non_finite: list[tuple[Any, str]] = []
        limit = points_each(len(by_process))
        for process, points in by_process.items():
            xs = [p[1] for p in points] if on_steps else list(range(len(points)))
            ys = [p[2] for p in points]
            name = f"{process}: {mark}" if len(by_process) > 1 else mark
            add_line(figure, xs, ys, name, limit)
            non_finite += [
                (x, f"{process}: {mark} not finite")
                for x, y in zip(xs, ys, strict=True)
                if y is None
            ]
        mark_non_finite(figure, non_finite)
        figure.update_layout(
            xaxis_title=semconv.STEP if on_steps else "n-th value (some are outside any step)",
            yaxis_title=label(mark),
        )
        charts.append(Chart(f"mark-{number}", f"Mark: {mark}", figure))
    return charts
