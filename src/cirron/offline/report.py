"""A run report from spans (a spool, read back): findings in plain words, then the charts.

``cirron report`` writes it as one self-contained HTML file: the charts are
Plotly's, with plotly.js inlined (about 5 MB), so the file opens offline, with
no CDN, and every chart zooms and shows values on hover. ``cirron show
--diagnose`` prints the same findings (:mod:`cirron.offline.findings`).

What it shows, per process (``rank 0``, or ``pid 1234`` without a rank):

- the findings, errors first, each with its severity, what to do next, and a link
  to the chart it is about;
- step time and the share of each step spent waiting for data, against the step's
  number in the run (Keras's batch indexes restart each epoch; these do not);
- the step time of each epoch split into ``data_load``, ``forward``, ``backward``,
  ``optimizer_step`` and the rest, each interval counted once;
- every point mark (``loss``, ``lr``, ...) at the step it was recorded in, and the
  summary marks in a table per epoch;
- from snapshots (``ci.watch(model)``), the weight and gradient norms of the tensors
  that changed most over the epochs, NaN and Inf marked, and their latest histograms.

Every name comes from the user's program and is shown as text, never as markup.
The charts are drawn by :mod:`cirron.offline.charts`.
"""

from __future__ import annotations

import html
from typing import Any

from ..exporters.lines import format_value
from ..otel import semconv
from .charts import Chart, Charted, mark_charts, shorten, step_charts
from .finding import SEVERITIES, Finding
from .findings import diagnose
from .runs import Run
from .snapshot_charts import snapshot_charts

__all__ = ["build"]

STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1400px}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}"
    "td{text-align:right}#findings li{margin:.4em 0}"
    ".severity{display:inline-block;width:5em;font-weight:bold;text-transform:uppercase}"
    ".error .severity{color:#c00}.warning .severity{color:#b60}.info .severity{color:#058}"
    ".next{margin-left:5em;color:#444}.note{color:#555}"
)


def _escape(text: Any) -> str:
    return html.escape(str(text), quote=True)


# -- findings -----------------------------------------------------------------------------------
def _finding_item(finding: Finding, anchors: set[str], prefix: str) -> str:
    severity = finding.severity if finding.severity in SEVERITIES else SEVERITIES[-1]
    text = _escape(prefix + finding.text)
    if finding.chart in anchors:
        text = f'<a href="#{_escape(finding.chart)}">{text}</a>'
    action = f'<div class="next">next: {_escape(finding.action)}</div>' if finding.action else ""
    return f'<li class="{severity}"><span class="severity">{severity}</span> {text}{action}</li>'


def _findings(chosen: list[Run], anchors: set[str]) -> str:
    items = []
    for run in chosen:
        prefix = f"run {run.id[:8]}: " if len(chosen) > 1 else ""
        items += [_finding_item(finding, anchors, prefix) for finding in diagnose(run)]
    return "<ul id='findings'>" + ("".join(items) or "<li>Nothing to report.</li>") + "</ul>"


# -- charts -------------------------------------------------------------------------------------
def _chart(chart: Chart) -> str:
    note = f"<p class='note'>{_escape(chart.note)}</p>" if chart.note else ""
    figure = chart.figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=f"{chart.id}-chart"
    )
    return f"<h3 id='{_escape(chart.id)}'>{_escape(chart.title)}</h3>{note}{figure}"


def _sections(charted: Charted) -> list[tuple[str, str, list[Chart], str]]:
    """(anchor, heading, charts, what to say when there are none) of each section."""
    return [
        ("step-charts", "Steps", step_charts(charted), "No steps recorded."),
        ("marks", "Marks", mark_charts(charted), "No numeric point marks recorded."),
        (
            "snapshots",
            "Weights and gradients",
            snapshot_charts(charted),
            "No snapshots: ci.watch(model) records them at each epoch's end.",
        ),
    ]


# -- summary marks ------------------------------------------------------------------------------
def _summary_rows(charted: Charted) -> list[tuple[str, Any, dict[str, Any]]]:
    """(process, epoch index, {mark: value}) of every epoch with summary marks."""
    rows = []
    for process, timeline in charted.timelines:
        for span in timeline.spans:
            attributes = span.attributes or {}
            marks = {
                key[len(semconv.MARK_PREFIX) :]: value
                for key, value in attributes.items()
                if key.startswith(semconv.MARK_PREFIX)
            }
            if span.name == semconv.EPOCH and marks:
                rows.append((process, attributes.get(semconv.INDEX), marks))
    return rows


def _summary_columns(rows: list[tuple[str, Any, dict[str, Any]]]) -> list[tuple[str, str]]:
    """(mark, heading) of each mark column: a mark named like a fixed column is headed
    "<name> (mark)", and a mark ``epoch`` that only repeats the epoch's index is left out."""
    fixed = ("process", semconv.EPOCH)
    columns = []
    for name in sorted({name for _process, _index, marks in rows for name in marks}):
        if name == semconv.EPOCH and all(
            name not in marks or marks[name] == index for _process, index, marks in rows
        ):
            continue
        columns.append((name, f"{name} (mark)" if name in fixed else name))
    return columns


def _summary_table(charted: Charted) -> str:
    rows = _summary_rows(charted)
    if not rows:
        return "<p>No summary marks.</p>"
    columns = _summary_columns(rows)
    head = "<th>process</th><th>epoch</th>" + "".join(
        f"<th title='{_escape(heading)}'>{_escape(shorten(heading))}</th>"
        for _name, heading in columns
    )
    body = []
    for process, index, marks in sorted(rows, key=lambda row: (row[0], str(row[1]))):
        cells = [process, index] + [marks.get(name, "") for name, _heading in columns]
        body.append("<tr>" + "".join(f"<td>{_escape(_cell(v))}</td>" for v in cells) + "</tr>")
    return f'<table id="summary"><tr>{head}</tr>{"".join(body)}</table>'


def _cell(value: Any) -> str:
    return "" if value is None or value == "" else format_value(value)


# -- the document -------------------------------------------------------------------------------
def build(chosen: list[Run], title: str = "cirron run report") -> str:
    """The report as one self-contained HTML document (needs plotly: ``cirron-otel[report]``)."""
    try:
        import plotly.offline
    except ImportError as error:
        raise ImportError(
            "cirron report draws its charts with plotly: pip install 'cirron-otel[report]'"
        ) from error

    charted = Charted(chosen)
    sections = _sections(charted)
    anchors = {anchor for anchor, *_rest in sections}
    anchors |= {chart.id for _anchor, _heading, charts, _none in sections for chart in charts}
    runs = f" in {len(chosen)} runs" if len(chosen) > 1 else ""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{_escape(title)}</title><style>{STYLE}</style>",
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>",
        f"<h1>{_escape(title)}</h1>",
        f"<p>{len(charted.spans)} spans from {len(charted.timelines)} process(es){runs}.</p>",
        "<h2>Findings</h2>",
        _findings(chosen, anchors),
    ]
    for anchor, heading, charts, none in sections:
        parts.append(f"<h2 id='{anchor}'>{_escape(heading)}</h2>")
        parts += [_chart(chart) for chart in charts] or [f"<p>{_escape(none)}</p>"]
    parts.append("<h2 id='summary-marks'>Summary marks per epoch</h2>")
    parts.append(_summary_table(charted))
    parts.append("</body></html>")
    return "\n".join(parts)
