"""One row of the benchmark table, and the table printed from the rows."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One operation: our figure, a baseline from the same process, the reference SDK's.

    Values are in ns for ``unit="us"`` rows, else already in ``unit``. A
    missing baseline or reference (None) prints as ``-``, and so does a ratio
    to it.
    """

    operation: str
    ours: float
    baseline_name: str = ""
    baseline: float | None = None
    unit: str = "us"
    reference: float | None = None
    note: str = ""  # printed under the table
    spread: float | None = None  # half the interquartile range of our samples, in our unit


def half_iqr(values: Iterable[float]) -> float | None:
    """Half the interquartile range: how far a typical sample sits from the median."""
    values = list(values)
    if len(values) < 2:
        return None
    low, _median, high = statistics.quantiles(values, n=4)
    return (high - low) / 2


def median_interval(values: Iterable[float]) -> tuple[float, float] | None:
    """A 95 % interval for the median of the population ``values`` were drawn from.

    Distribution-free (the order statistics a binomial(n, 1/2) count puts
    either side of the median 95 % of the time), so a skewed or noisy set of
    pairs gets an honest one. Where the spread says how far one pair strays,
    this says how far the median itself may be off: whether a target is met.
    None for fewer than 6 values, whose widest interval covers less than 95 %.
    """
    ordered = sorted(values)
    count = len(ordered)
    if count < 6:
        return None
    # The largest k with P(Binomial(count, 1/2) < k) <= 2.5 %: then
    # [ordered[k - 1], ordered[count - k]] covers the median at least 95 % of the time.
    below, k = 0.0, 0
    while (below := below + math.comb(count, k) / 2**count) <= 0.025:
        k += 1
    return ordered[k - 1], ordered[count - k]


def _format(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "us":
        return f"{value / 1000:.2f} us"
    if unit == "%":
        return f"{value:.2f} %"
    if unit == "calls":
        return f"{value:.0f} calls"
    return f"{value:.2f} {unit}"


def _ratio(ours: float, other: float | None) -> str:
    return f"{ours / other:.2f}x" if other else "-"


def print_table(rows: list[Row], reference_name: str) -> None:
    """Columns: operation | cirron, its spread | baseline (same run) | ratio | reference | ratio."""
    widths = (38, 10, 10, 28, 10, 7, max(10, len(reference_name)), 7)
    header = (
        "operation",
        "cirron",
        "spread",
        "baseline (same run)",
        "",
        "ratio",
        reference_name,
        "ratio",
    )
    lines = [header]
    for row in rows:
        lines.append(
            (
                row.operation,
                _format(row.ours, row.unit),
                "" if row.spread is None else "±" + _format(row.spread, row.unit),
                row.baseline_name or "-",
                _format(row.baseline, row.unit),
                _ratio(row.ours, row.baseline),
                _format(row.reference, row.unit),
                _ratio(row.ours, row.reference),
            )
        )
    for index, cells in enumerate(lines):
        aligned = [
            cell.ljust(width) if column in (0, 3) else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        # Three groups: the operation and our figure | the baseline | the reference SDK.
        text = (
            " ".join(aligned[:3]) + " | " + " ".join(aligned[3:6]) + " | " + " ".join(aligned[6:])
        )
        print(text)
        if index == 0:
            print("-" * len(text))
    for row in rows:
        if row.note:
            print(f"{row.operation.strip()}: {row.note}")


def _cell(text: str) -> str:
    """A markdown table cell: the pipe escaped, leading spaces (a sub-row's indent) made visible."""
    stripped = text.lstrip(" ")
    indent = "&nbsp;&nbsp;" if len(stripped) < len(text) else ""
    return indent + stripped.replace("|", "\\|")


def markdown_table(rows: list[Row], reference_name: str) -> str:
    """The rows as a markdown table, for the documentation site.

    The baseline's and the reference SDK's columns are left out when no row has such a figure
    (the reference was not installed); the notes follow the table.
    """
    with_baseline = any(row.baseline is not None for row in rows)
    with_reference = any(row.reference is not None for row in rows)
    header = ["operation", "cirron", "spread"]
    header += ["baseline (same run)", "baseline", "ratio"] if with_baseline else []
    header += [reference_name, "ratio"] if with_reference else []
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        cells = [
            _cell(row.operation),
            _format(row.ours, row.unit),
            "" if row.spread is None else "±" + _format(row.spread, row.unit),
        ]
        if with_baseline:
            cells += [
                _cell(row.baseline_name or "-"),
                _format(row.baseline, row.unit),
                _ratio(row.ours, row.baseline),
            ]
        if with_reference:
            cells += [_format(row.reference, row.unit), _ratio(row.ours, row.reference)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {row.operation.strip()}: {row.note}" for row in rows if row.note]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"
