"""The report's view of the ranks of a run (:mod:`cirron.offline.ranks`): a heat map of each
rank's own time per step (the step less its wait in collectives), the rank the others waited
for standing out as the hot row, and what explains each cell on hover."""

from __future__ import annotations

from ..otel import semconv
from .charts import MAX_POINTS, Chart, plot_text, plotly
from .ranks import COMMUNICATION, PARTS, WORDS, Alignment
from .runs import Run

# Cells of the heat map: 64 ranks get 250 columns, 8 ranks 2,000 (hover text and all, a cell
# weighs about 150 bytes of the page).
CELLS = 16_000


def rank_heat_map(run: Run, alignment: Alignment, several_runs: bool) -> Chart:
    """Ranks by steps: each cell the rank's own time at that step, in ms; past the cells a
    chart holds, each column a run of steps and each cell its slowest (a straggler's step
    stays in sight)."""
    columns = max(1, min(MAX_POINTS, CELLS // max(len(alignment.ranks), 1)))
    size = max(1, -(-alignment.steps // columns))
    numbers = list(range(0, alignment.steps, size))
    z, hover = [], []
    for rank in alignment.ranks:
        row, texts = [], []
        for first in numbers:
            slowest = max(range(first, min(first + size, alignment.steps)), key=rank.own_ns)
            row.append(rank.own_ns(slowest) / 1e6)
            texts.append(
                plot_text(
                    (f"step {slowest}: " if size > 1 else "") + _cell_text(rank.parts[slowest])
                )
            )
        z.append(row)
        hover.append(texts)
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
        + (f" Each column is {size} steps, each cell the slowest of them." if size > 1 else ""),
    )


def _cell_text(parts: dict[str, int]) -> str:
    return ", ".join(
        f"{WORDS[part]} {parts[part] / 1e6:.3g} ms"
        for part in PARTS
        if parts[part] or part == COMMUNICATION
    )
