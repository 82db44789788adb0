"""A run report from spans (a spool, read back): findings in plain words, then the charts.

``cirron report`` writes it as one self-contained HTML file: the charts are
Plotly's, with plotly.js inlined (about 5 MB), so the file opens offline, with
no CDN, and every chart zooms and shows values on hover. ``cirron show
--diagnose`` prints the same findings.

What it shows, per rank (a process's ``cirron.rank``, else its pid):

- the step-time series and each step's share spent waiting for data;
- the step time of each epoch split into ``data_load``, ``forward``,
  ``backward``, ``optimizer_step`` and the rest (the step's direct children);
- every point mark as a line (``loss``, ``lr``, ...), summary marks as a table
  per epoch;
- from snapshots, each tensor's norm over the epochs (weights and gradients)
  and the latest histograms.

Long runs: a series of more than :data:`MAX_POINTS` points is cut into that
many buckets, each shown by its largest value (so a slow step stays
visible), which keeps a 100k-step report quick to open.
"""

from __future__ import annotations

import html
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..otel import semconv

MAX_POINTS = 2000
SLOW_FACTOR = 3.0  # a step slower than this many times the median is listed
INPUT_BOUND = 0.2  # this share of step time waiting for data or more: input-bound
PARTS = semconv.STEP_PARTS
COLORS = {  # one color per part in every rank's bars
    semconv.DATA_LOAD: "#636efa",
    semconv.FORWARD: "#ef553b",
    semconv.BACKWARD: "#00cc96",
    semconv.OPTIMIZER_STEP: "#ab63fa",
    "other": "#ffa15a",
}


@dataclass
class Finding:
    text: str  # one sentence, plain words
    chart: str  # the id of the chart it refers to


# -- reading the spans --------------------------------------------------------------------------
def _rank(span: Any) -> str:
    attributes = span.resource.attributes
    rank = attributes.get(semconv.RANK)
    return f"rank {rank}" if rank is not None else f"pid {attributes.get(semconv.PROCESS_PID, '?')}"


def _duration(span: Any) -> float | None:
    if span.end_time is None:
        return None
    return (span.end_time - span.start_time) / 1e6  # ms


class Run:
    """The spans of a spool, indexed for the report."""

    def __init__(self, spans: list[Any]) -> None:
        self.spans = spans
        self.by_id = {span.context.span_id: span for span in spans}
        self.children: dict[int, list[Any]] = defaultdict(list)
        for span in spans:
            if span.parent is not None:
                self.children[span.parent.span_id].append(span)
        self.ranks = sorted({_rank(span) for span in spans})

    def steps(self, rank: str) -> list[Any]:
        """The rank's steps (``step`` spans, else ``batch`` spans) in start order."""
        mine = [s for s in self.spans if _rank(s) == rank and s.end_time is not None]
        steps = [s for s in mine if s.name == semconv.STEP] or [
            s for s in mine if s.name == semconv.BATCH
        ]
        return sorted(steps, key=lambda s: s.start_time)

    def epoch_of(self, span: Any) -> Any:
        parent = span.parent
        while parent is not None:
            above = self.by_id.get(parent.span_id)
            if above is None:
                return None
            if above.name == semconv.EPOCH:
                return above
            parent = above.parent
        return None

    def snapshots(self) -> list[tuple[Any, Any]]:
        """(epoch index or None, snapshot span) of every snapshot, in start order."""
        found = []
        for span in sorted(self.spans, key=lambda s: s.start_time):
            if span.name == semconv.SNAPSHOT:
                epoch = self.epoch_of(span)
                found.append(((epoch.attributes or {}).get(semconv.INDEX) if epoch else None, span))
        return found

    def waiting(self, step: Any) -> float:
        """Milliseconds of ``step`` spent fetching data (its ``data_load`` children)."""
        total = sum(
            _duration(c) or 0.0
            for c in self.children[step.context.span_id]
            if c.name == semconv.DATA_LOAD
        )
        ns = (step.attributes or {}).get(semconv.DATA_LOAD_NS)  # ci.batches over a DataLoader
        return total + (ns / 1e6 if isinstance(ns, int) else 0.0)


def _downsample(xs: list[Any], ys: list[float]) -> tuple[list[Any], list[float]]:
    if len(xs) <= MAX_POINTS:
        return xs, ys
    size = math.ceil(len(xs) / MAX_POINTS)
    out_x, out_y = [], []
    for start in range(0, len(xs), size):
        bucket = range(start, min(start + size, len(xs)))
        top = max(bucket, key=lambda i: ys[i])
        out_x.append(xs[top])
        out_y.append(ys[top])
    return out_x, out_y


# -- the findings -------------------------------------------------------------------------------
def diagnose(spans: list[Any]) -> list[Finding]:
    run = Run(spans)
    findings: list[Finding] = []
    medians: dict[str, float] = {}
    for rank in run.ranks:
        steps = run.steps(rank)
        if not steps:
            continue
        times = [_duration(s) or 0.0 for s in steps]
        medians[rank] = statistics.median(times)
        total = sum(times)
        waiting = sum(run.waiting(s) for s in steps)
        share = waiting / total if total else 0.0
        verdict = "input-bound" if share >= INPUT_BOUND else "not input-bound"
        findings.append(
            Finding(
                f"{rank}: {share:.0%} of step time is spent waiting for data ({verdict}; "
                f"{len(steps)} steps, median {medians[rank]:.2f} ms).",
                "step-times",
            )
        )
        slow = [
            (s.attributes or {}).get(semconv.INDEX, i)
            for i, (s, t) in enumerate(zip(steps, times, strict=True))
            if t > SLOW_FACTOR * medians[rank]
        ]
        if slow:
            shown = ", ".join(str(i) for i in slow[:20]) + (" ..." if len(slow) > 20 else "")
            findings.append(
                Finding(
                    f"{rank}: {len(slow)} step(s) took more than {SLOW_FACTOR:g}x the median: "
                    f"{shown}.",
                    "step-times",
                )
            )
    if len(medians) > 1:
        slowest = max(medians, key=lambda r: medians[r])
        middle = statistics.median(medians.values())
        gap = (medians[slowest] - middle) / middle if middle else 0.0
        findings.append(
            Finding(
                f"The slowest rank is {slowest}: its median step is {medians[slowest]:.2f} ms, "
                f"{gap:+.0%} against the median rank.",
                "step-times",
            )
        )
    first_bad = _first_non_finite(run)
    if first_bad is not None:
        epoch, tensor, rank = first_bad
        findings.append(
            Finding(
                f"{rank}: the snapshot of epoch {epoch} is the first with NaN or Inf values "
                f"(first: {tensor}).",
                "norms",
            )
        )
    elif any(s.name == semconv.SNAPSHOT for s in spans):
        findings.append(Finding("No snapshot holds NaN or Inf values.", "norms"))
    return findings


def _first_non_finite(run: Run) -> tuple[Any, str, str] | None:
    found = []
    for index, span in run.snapshots():
        for event in span.events:
            attributes = event.attributes or {}
            if attributes.get(semconv.NAN_COUNT, 0) or attributes.get(semconv.INF_COUNT, 0):
                found.append((index if index is not None else -1, event.name, _rank(span)))
                break
    return min(found, key=lambda f: f[0]) if found else None


# -- the charts ---------------------------------------------------------------------------------
def _figures(run: Run) -> list[tuple[str, str, Any]]:
    """(id, title, plotly figure) of every chart."""
    import plotly.graph_objects as go

    charts: list[tuple[str, str, Any]] = []
    step_times = go.Figure()
    stalls = go.Figure()
    breakdown = go.Figure()
    for rank in run.ranks:
        steps = run.steps(rank)
        if not steps:
            continue
        xs = [(s.attributes or {}).get(semconv.INDEX, i) for i, s in enumerate(steps)]
        ys = [_duration(s) or 0.0 for s in steps]
        dx, dy = _downsample(xs, ys)
        step_times.add_scatter(x=dx, y=dy, mode="lines", name=rank)
        shares = [100 * run.waiting(s) / t if t else 0.0 for s, t in zip(steps, ys, strict=True)]
        sx, sy = _downsample(xs, shares)
        stalls.add_scatter(x=sx, y=sy, mode="lines", name=rank)
        per_epoch: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for step, total in zip(steps, ys, strict=True):
            epoch = run.epoch_of(step)
            key = (epoch.attributes or {}).get(semconv.INDEX) if epoch is not None else "-"
            parts = per_epoch[key]
            inside = 0.0
            for child in run.children[step.context.span_id]:
                if child.name in PARTS:
                    parts[child.name] += _duration(child) or 0.0
                    inside += _duration(child) or 0.0
            parts["other"] += max(total - inside, 0.0)
        epochs = list(per_epoch)
        for part in (*PARTS, "other"):
            breakdown.add_bar(
                x=[f"{rank} epoch {e}" for e in epochs],
                y=[per_epoch[e][part] for e in epochs],
                name=part,
                legendgroup=part,
                marker_color=COLORS[part],
                showlegend=rank == run.ranks[0],
            )
    step_times.update_layout(xaxis_title=semconv.STEP, yaxis_title="ms")
    stalls.update_layout(xaxis_title=semconv.STEP, yaxis_title="% of the step waiting for data")
    breakdown.update_layout(barmode="stack", yaxis_title="ms (sum over the epoch's steps)")
    charts += [
        ("step-times", "Step time per rank", step_times),
        ("stalls", "Data-load stall per step", stalls),
        ("breakdown", "Step time by part, per epoch", breakdown),
    ]
    charts += _mark_charts(run, go)
    charts += _snapshot_charts(run, go)
    return charts


def _mark_charts(run: Run, go: Any) -> list[tuple[str, str, Any]]:
    series: dict[str, dict[str, tuple[list[int], list[float]]]] = defaultdict(dict)
    for span in sorted(run.spans, key=lambda s: s.start_time):
        for event in span.events:
            value = (event.attributes or {}).get(semconv.MARK_VALUE)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                xs, ys = series[event.name].setdefault(_rank(span), ([], []))
                xs.append(len(xs))
                ys.append(float(value))
    charts = []
    for number, (name, by_rank) in enumerate(sorted(series.items())):
        figure = go.Figure()
        for rank, (xs, ys) in sorted(by_rank.items()):
            dx, dy = _downsample(xs, ys)
            figure.add_scatter(x=dx, y=dy, mode="lines", name=rank)
        figure.update_layout(xaxis_title="n-th value", yaxis_title=name)
        charts.append((f"mark-{number}", f"Mark: {name}", figure))
    return charts


def _snapshot_charts(run: Run, go: Any) -> list[tuple[str, str, Any]]:
    norms: dict[tuple[str, str], tuple[list[Any], list[float]]] = {}
    latest: dict[str, tuple[Any, Any]] = {}  # tensor -> (epoch index, event)
    for index, span in run.snapshots():
        for event in span.events:
            attributes = event.attributes or {}
            kind = attributes.get(semconv.TENSOR_KIND, semconv.KIND_WEIGHT)
            xs, ys = norms.setdefault((event.name, kind), ([], []))
            xs.append(index)
            ys.append(float(attributes.get(semconv.NORM, 0.0)))
            if kind == semconv.KIND_WEIGHT:
                latest[event.name] = (index, event)
    if not norms:
        return []
    figure = go.Figure()
    for (name, kind), (xs, ys) in sorted(norms.items()):
        figure.add_scatter(x=xs, y=ys, mode="lines+markers", name=f"{name} ({kind})")
    figure.update_layout(xaxis_title=semconv.EPOCH, yaxis_title="L2 norm")
    charts = [("norms", "Weight and gradient norms per tensor", figure)]
    histograms = go.Figure()
    for name, (index, event) in list(sorted(latest.items()))[:12]:
        attributes = event.attributes or {}
        low, high = (list(attributes.get(semconv.HISTOGRAM_RANGE) or (0.0, 0.0)) + [0.0, 0.0])[:2]
        counts = list(attributes.get(semconv.HISTOGRAM) or [])
        width = (high - low) / len(counts) if counts and high > low else 1.0
        histograms.add_bar(
            x=[low + width * (i + 0.5) for i in range(len(counts))],
            y=counts,
            name=f"{name} (epoch {index})",
        )
    histograms.update_layout(barmode="overlay", xaxis_title="value", yaxis_title="count")
    charts.append(("histograms", "Latest weight histograms", histograms))
    return charts


def _summary_table(run: Run) -> str:
    rows: dict[tuple[str, Any], dict[str, Any]] = {}
    names: set[str] = set()
    for span in run.spans:
        if span.name != semconv.EPOCH:
            continue
        marks = {
            key[len(semconv.MARK_PREFIX) :]: value
            for key, value in (span.attributes or {}).items()
            if key.startswith(semconv.MARK_PREFIX)
        }
        if marks:
            rows[(_rank(span), (span.attributes or {}).get(semconv.INDEX))] = marks
            names |= set(marks)
    if not rows:
        return "<p>No summary marks.</p>"
    columns = sorted(names)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["rank", semconv.EPOCH, *columns])
    body = []
    for (rank, index), marks in sorted(rows.items(), key=lambda r: (r[0][0], r[0][1] or 0)):
        cells = [rank, index] + [marks.get(c, "") for c in columns]
        body.append("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in cells) + "</tr>")
    return f'<table id="summary"><tr>{head}</tr>{"".join(body)}</table>'


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def build(spans: list[Any], title: str = "cirron run report") -> str:
    """The report as one self-contained HTML document (needs plotly: ``cirron-otel[report]``)."""
    try:
        import plotly.offline
    except ImportError as error:
        raise ImportError(
            "cirron report draws its charts with plotly: pip install 'cirron-otel[report]'"
        ) from error

    run = Run(spans)
    findings = diagnose(spans)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px}</style>",
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(spans)} spans from {len(run.ranks)} process(es).</p>",
        "<h2>Findings</h2><ul id='findings'>",
    ]
    parts += [f"<li><a href='#{f.chart}'>{html.escape(f.text)}</a></li>" for f in findings] or [
        "<li>No steps recorded.</li>"
    ]
    parts.append("</ul>")
    for chart_id, chart_title, figure in _figures(run):
        parts.append(f"<h2 id='{chart_id}'>{html.escape(chart_title)}</h2>")
        parts.append(
            figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"{chart_id}-chart")
        )
    parts.append("<h2>Summary marks per epoch</h2>")
    parts.append(_summary_table(run))
    parts.append("</body></html>")
    return "\n".join(parts)
