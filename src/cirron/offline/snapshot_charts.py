"""The report's snapshot charts: weight and gradient norms over the epochs (the tensors whose
norm changed most) and their latest histograms (see :mod:`cirron.offline.charts`)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..otel import semconv
from .charts import (
    TOP_TENSORS,
    Chart,
    Charted,
    epoch_index,
    finite,
    label,
    mark_non_finite,
    plot_text,
    plotly,
    shorten,
    whole_numbers,
)


@dataclass
class _Tensor:
    """One tensor's norms over the snapshots (x: the epoch), and its latest statistics."""

    name: str  # as shown: the tensor's name, after its process and model where there are several
    xs: list[Any] = field(default_factory=list)
    norms: list[float | None] = field(default_factory=list)  # None: NaN or Inf values
    hover: list[str] = field(default_factory=list)  # plain text, per snapshot
    non_finite: list[tuple[Any, str]] = field(default_factory=list)  # (x, hover text)
    latest: dict[str, Any] = field(default_factory=dict)  # the last snapshot's attributes
    latest_x: Any = None

    def add(self, x: Any, attributes: dict[str, Any]) -> None:
        nan = attributes.get(semconv.NAN_COUNT) or 0
        inf = attributes.get(semconv.INF_COUNT) or 0
        norm = finite(attributes.get(semconv.NORM))
        self.xs.append(x)
        self.norms.append(None if nan or inf else norm)
        self.hover.append(self.name)
        if self.norms[-1] is None:  # the norm of the finite values only, or none: not drawn
            what = "Inf" if inf and not nan else "NaN"
            self.hover[-1] = f"{self.name}: {what} ({nan} NaN, {inf} Inf values)"
            self.non_finite.append((x, self.hover[-1]))
        self.latest, self.latest_x = attributes, x

    @property
    def change(self) -> float:
        """The relative change of the norm from the first finite snapshot to the last."""
        finite = [norm for norm in self.norms if norm is not None]
        if len(finite) < 2:
            return 0.0
        first, last = finite[0], finite[-1]
        return abs(last - first) / abs(first) if first else (math.inf if last else 0.0)


def _tensors(charted: Charted) -> dict[str, list[_Tensor]]:
    """kind (weight, gradient) -> the tensors of every snapshot of every process."""
    found: dict[tuple[str, str], _Tensor] = {}
    several = len(charted.timelines) > 1
    for process, timeline in charted.timelines:
        snapshots = [span for span in timeline.spans if span.name == semconv.SNAPSHOT]
        models = {(span.attributes or {}).get(semconv.SNAPSHOT_MODEL) for span in snapshots}
        for order, span in enumerate(snapshots):
            x = epoch_index(timeline.enclosing(span, semconv.EPOCH), order)
            model = (span.attributes or {}).get(semconv.SNAPSHOT_MODEL)
            prefix = (f"{process}: " if several else "") + (f"{model}: " if len(models) > 1 else "")
            for event in span.events:
                attributes = dict(event.attributes or {})
                kind = str(attributes.get(semconv.TENSOR_KIND, semconv.KIND_WEIGHT))
                name = prefix + event.name
                found.setdefault((kind, name), _Tensor(name)).add(x, attributes)
    by_kind: dict[str, list[_Tensor]] = defaultdict(list)
    for (kind, _name), tensor in found.items():
        by_kind[kind].append(tensor)
    return by_kind


def _top(tensors: list[_Tensor]) -> tuple[list[_Tensor], list[_Tensor]]:
    """The tensors to draw (those with NaN or Inf first, then by change), and the rest."""
    ranked = sorted(tensors, key=lambda t: (not t.non_finite, -t.change, t.name))
    return ranked[:TOP_TENSORS], ranked[TOP_TENSORS:]


def _percent(share: float) -> str:
    percent = 100 * share
    return f"{percent:.2g}%" if percent < 10 else f"{percent:,.0f}%"


def _rest(drawn: list[_Tensor], rest: list[_Tensor]) -> str:
    if not rest:
        return ""
    median = statistics.median(tensor.change for tensor in rest)
    broken = sum(1 for tensor in rest if tensor.non_finite)
    return (
        f" ({len(drawn)} that changed most, and {len(rest)} more: median change {_percent(median)}"
        + (f", {broken} of them with NaN or Inf" if broken else "")
        + ")"
    )


def _norm_chart(chart_id: str, title: str, tensors: list[_Tensor]) -> Chart:
    drawn, rest = _top(tensors)
    figure = plotly().Figure()
    non_finite: list[tuple[Any, str]] = []
    for tensor in drawn:
        figure.add_scatter(
            x=tensor.xs,
            y=tensor.norms,
            mode="lines+markers",
            name=label(tensor.name),
            hovertext=[plot_text(text) for text in tensor.hover],
            hoverinfo="x+y+text",
        )
        non_finite += tensor.non_finite
    mark_non_finite(figure, non_finite)
    figure.update_layout(xaxis_title=semconv.EPOCH, yaxis_title="L2 norm")
    whole_numbers(figure, [x for tensor in drawn for x in tensor.xs])
    note = (
        "A red cross marks a snapshot with NaN or Inf values: its norm is left out."
        if non_finite
        else ""
    )
    return Chart(chart_id, title + _rest(drawn, rest), figure, note)


def snapshot_charts(charted: Charted) -> list[Chart]:
    """Weight and gradient norms over the epochs, and the drawn weights' latest histograms."""
    by_kind = _tensors(charted)
    charts = []
    weights = by_kind.get(semconv.KIND_WEIGHT, [])
    if weights:
        charts.append(_norm_chart("norms", "Weight norm per tensor", weights))
    if by_kind.get(semconv.KIND_GRADIENT):
        gradients = by_kind[semconv.KIND_GRADIENT]
        charts.append(_norm_chart("gradient-norms", "Gradient norm per tensor", gradients))
    if weights:
        charts.append(_histogram_chart(_top(weights)[0]))
    return charts


def _histogram_bars(attributes: dict[str, Any]) -> tuple[list[float], list[int], float] | None:
    """(bin centres, counts, bin width: 0 for a constant tensor), None without a finite range."""
    bounds = list(attributes.get(semconv.HISTOGRAM_RANGE) or ())
    counts = [int(count) for count in attributes.get(semconv.HISTOGRAM) or ()]
    if len(bounds) != 2 or not counts:
        return None
    low, high = (finite(bound) for bound in bounds)
    if low is None or high is None:
        return None
    if high <= low:  # every value is the same: one bar
        return [low], [sum(counts)], 0.0
    width = (high - low) / len(counts)
    return [low + width * (i + 0.5) for i in range(len(counts))], counts, width


def _histogram_chart(tensors: list[_Tensor]) -> Chart:
    figure = plotly().Figure()
    bars = {tensor.name: _histogram_bars(tensor.latest) for tensor in tensors}
    widths = [found[2] for found in bars.values() if found is not None and found[2] > 0]
    skipped = []
    for tensor in tensors:
        found = bars[tensor.name]
        if found is None:
            skipped.append(shorten(tensor.name))
            continue
        centres, counts, width = found
        # A constant tensor's bar is as wide as the other tensors' bins, else a tenth of its value.
        width = width or (statistics.median(widths) if widths else abs(centres[0]) / 10 or 1.0)
        figure.add_bar(
            x=centres,
            y=counts,
            width=[width] * len(centres),
            opacity=0.6,
            name=label(f"{tensor.name} (epoch {tensor.latest_x})"),
            hovertext=plot_text(tensor.name),
            hoverinfo="x+y+text",
        )
    figure.update_layout(barmode="overlay", xaxis_title="tensor values", yaxis_title="count")
    note = (
        "Not drawn, with no finite value in the latest snapshot: " + ", ".join(skipped) + "."
        if skipped
        else ""
    )
    return Chart("histograms", "Latest weight histograms (the tensors drawn above)", figure, note)
