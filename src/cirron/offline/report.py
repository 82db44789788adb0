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
  that changed most over the epochs, NaN and Inf marked, and their latest histograms;
- for a run of several ranks, a heat map of the ranks by steps (each rank's own time, its
  wait in collectives left out) and the table ``cirron show --ranks`` prints;
- for two runs (``cirron report A B``), the table ``cirron compare`` prints, first.

Every name comes from the user's program and is shown as text, never as markup.
The charts are drawn by :mod:`cirron.offline.charts`.
"""

from __future__ import annotations

import datetime
import html
from typing import Any

from ..exporters.lines import format_value
from ..otel import semconv
from . import compare
from .charts import Chart, Charted, mark_charts, shorten, step_charts
from .finding import SEVERITIES, Finding
from .findings import diagnose
from .rank_charts import rank_heat_map
from .ranks import PARTS, WORDS, Alignment, align, rows
from .resource_charts import resource_charts
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
            "resource-charts",
            "Memory and CPU",
            resource_charts(charted),
            "No step recorded its memory or CPU time.",
        ),
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


# -- ranks and runs -----------------------------------------------------------------------------
def _ranks(chosen: list[Run]) -> tuple[list[Chart], list[str]]:
    """The heat map and the table of each run of several ranks (nothing for one rank)."""
    charts, tables = [], []
    for run in chosen:
        alignment = align(run)
        if alignment is None or not alignment.steps:
            continue
        charts.append(rank_heat_map(run, alignment, len(chosen) > 1))
        tables.append(_rank_table(alignment))
    return charts, tables


def _rank_table(alignment: Alignment) -> str:
    head = "<th>rank</th><th>steps</th><th>step</th>" + "".join(
        f"<th>{_escape(WORDS[part])}</th>" for part in PARTS
    )
    body = []
    for row in rows(alignment):
        cells = [row.label, str(row.steps), _ms_pair(row.step)]
        cells += [_ms_pair(row.parts[part]) for part in PARTS]
        cells.append(f"{row.slowest_in} of {alignment.steps}")
        body.append("<tr>" + "".join(f"<td>{_escape(cell)}</td>" for cell in cells) + "</tr>")
    return (
        f"<p class='note'>Median / p95 in ms over the {alignment.steps} steps every rank "
        "recorded; the last column counts the steps where the rank was the slowest.</p>"
        f"<table class='ranks'><tr>{head}<th>slowest in</th></tr>{''.join(body)}</table>"
    )


def _ms_pair(pair: tuple[float, float]) -> str:
    return f"{pair[0] / 1e6:.3g} / {pair[1] / 1e6:.3g}"


Compared = tuple[compare.Summary, compare.Summary, tuple[str, str]]


def _comparison(compared: Compared) -> str:
    a, b, where = compared
    body = "".join(
        f"<tr><th>{_escape(line.figure)}</th><td>{_escape(compare.shown(line.a, line.unit))}"
        f"</td><td>{_escape(compare.shown(line.b, line.unit))}</td>"
        f"<td>{_escape(compare.ratio_text(line))}</td></tr>"
        for line in compare.lines(a, b)
    )
    said, _over = compare.verdict(a, b, None)
    return (
        f"<h2 id='comparison'>A against B</h2><p>{_escape(compare.heading(a, where[0]))}"
        f"<br>{_escape(compare.heading(b, where[1]))}</p>"  # (each heading names its run A, B)
        f"<table><tr><th></th><th>A</th><th>B</th><th>B/A</th></tr>{body}</table>"
        f"<p>{_escape(said)}</p>"
    )


# -- the document -------------------------------------------------------------------------------
def _which_run(run: Run) -> str:
    """The run shown, among the folder's (a spool folder holds every run made in it)."""
    started = datetime.datetime.fromtimestamp(run.start_ns / 1e9, datetime.timezone.utc)
    return (
        f"<p id='run'>Run <code>{_escape(run.id)}</code>, started "
        f"{started:%Y-%m-%d %H:%M:%S} UTC: the folder's latest unless <code>--run</code> picked "
        "another (<code>cirron runs</code> lists them).</p>"
    )


def build(
    chosen: list[Run], title: str = "cirron run report", compared: Compared | None = None
) -> str:
    """The report as one self-contained HTML document (needs plotly: ``cirron-otel[report]``);
    ``compared``: two runs' summaries (:func:`cirron.offline.compare.summarize`) and where each
    is, shown first."""
    try:
        import plotly.offline
    except ImportError as error:
        raise ImportError(
            "cirron report draws its charts with plotly: pip install 'cirron-otel[report]'"
        ) from error

    charted = Charted(chosen)
    sections = _sections(charted)
    rank_charts, rank_tables = _ranks(chosen)
    if rank_charts:
        sections.insert(0, ("rank-charts", "Ranks", rank_charts, ""))
    anchors = {anchor for anchor, *_rest in sections}
    anchors |= {chart.id for _anchor, _heading, charts, _none in sections for chart in charts}
    runs = f" in {len(chosen)} runs" if len(chosen) > 1 else ""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{_escape(title)}</title><style>{STYLE}</style>",
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>",
        f"<h1>{_escape(title)}</h1>",
        f"<p>{charted.span_count:,} spans from {len(charted.timelines)} process(es){runs}.</p>",
        _which_run(chosen[0]) if compared is None and len(chosen) == 1 else "",
        _comparison(compared) if compared is not None else "",
        "<h2>Findings</h2>",
        _findings(chosen, anchors),
    ]
    for anchor, heading, charts, none in sections:
        parts.append(f"<h2 id='{anchor}'>{_escape(heading)}</h2>")
        parts += [_chart(chart) for chart in charts] or [f"<p>{_escape(none)}</p>"]
        if anchor == "rank-charts":
            parts += rank_tables
    parts.append("<h2 id='summary-marks'>Summary marks per epoch</h2>")
    parts.append(_summary_table(charted))
    parts.append("</body></html>")
    return "\n".join(parts)
