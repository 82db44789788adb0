"""The report's view of the ranks of a run (:mod:`cirron.offline.ranks`): a heat map of each
rank's own time per step (the step less its wait in collectives), the rank the others waited
for standing out as the hot row, and what explains each cell on hover."""

from __future__ import annotations

from ..otel import semconv
from .charts import MAX_POINTS, Chart, plot_text, plotly
from .ranks import COMMUNICATION, PARTS, WORDS, Alignment
from .runs import Run


def rank_heat_map(run: Run, alignment: Alignment, several_runs: bool) -> Chart:
    """Ranks by steps: each cell the rank's own time at that step, in ms."""
    stride = max(1, -(-alignment.steps // MAX_POINTS))  # at most MAX_POINTS columns
    numbers = list(range(0, alignment.steps, stride))
    z, hover = [], []
    for rank in alignment.ranks:
        z.append([rank.own_ns(n) / 1e6 for n in numbers])
        hover.append([plot_text(_cell_text(rank.parts[n])) for n in numbers])
    figure = plotly().Figure(
        plotly().Heatmap(
            z=z,
            x=numbers,
            y=[plot_text(rank.label) for rank in alignment.ranks],
            text=hover,
            hovertemplate="%{y}, step %{x}: %{z:.3g} ms of its own<br>%{text}<extra></extra>",
            colorscale="YlOrRd",
            colorbar={"title": "ms"},
        )
    )
    figure.update_layout(xaxis_title=semconv.STEP, yaxis_autorange="reversed")
    suffix = f" (run {run.id[:8]})" if several_runs else ""
    return Chart(
        f"ranks-{run.id[:8]}" if several_runs else "ranks",
        "Ranks by steps: each rank's own time" + suffix,
        figure,
        "A step's wall time less its wait in collectives (all-reduce, barrier): what the other "
        "ranks wait for. The hot row is the rank they waited for."
        + (f" Every {stride}th step is shown." if stride > 1 else ""),
    )


def _cell_text(parts: dict[str, int]) -> str:
    return ", ".join(
        f"{WORDS[part]} {parts[part] / 1e6:.3g} ms"
        for part in PARTS
        if parts[part] or part == COMMUNICATION
    )
