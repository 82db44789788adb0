"""The outline of a long run: the tree ``cirron show`` prints of a run too long to print whole.

A run of more than :data:`SHOWN_STEPS` steps prints as an outline unless ``--all`` is given:
the first and the last epoch, and in each epoch shown its first and last :data:`EDGE` steps,
and wherever they are the steps worth a look (:func:`notable`): the failed ones, those with a
mark that is not finite, and the slowest of those over 3x the median step. What is left out
is one line where it was, ``... 99,980 steps like these ...``. Everything that is not a step
or an epoch (the session, validation, checkpoints, snapshots) is shown.

The steps are chosen from the step rows of the spool's index (:mod:`cirron.offline.step_table`)
without reading a span; then only the spans of what is shown are decoded. A process the
index does not cover is not outlined (the caller prints the whole tree).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..exporters import lines, spool_reader
from ..otel import semconv
from . import readback, step_table
from .step_findings import SLOW_FACTOR, SLOW_MIN_NS

SHOWN_STEPS = 200  # a run of more steps (all processes together) is outlined
EDGE = 3  # steps shown at each end of an epoch shown
NOTABLE = 10  # steps shown of each kind worth a look (failed, not finite, slow)


@dataclass
class Outline:
    """What to show of a run: the step and epoch span ids kept and left out, and the lines
    that stand for what is left out."""

    shown: set[str] = field(default_factory=set)  # step ids
    hidden: set[str] = field(default_factory=set)  # step and epoch ids, and their parts'
    # (the id of the step or epoch after which the line goes, or of the first left out; its
    # parent's id; the line; its start for ordering)
    lines: list[tuple[str | None, str, int]] = field(default_factory=list)
    steps: int = 0


def notable(table: step_table.StepTable, rows: list[int]) -> set[int]:
    """The rows worth a look: failed, a mark that is not finite, and the slowest of the slow
    ones as the findings judge them (over 3x the median, and 1 ms more); :data:`NOTABLE` of
    each."""
    failed = [row for row in rows if table.status[row] == 2][:NOTABLE]
    non_finite = sorted(
        {
            row
            for marks in table.marks.values()
            for row, value, _time in marks
            if isinstance(value, float) and not math.isfinite(value)
        }
    )[:NOTABLE]
    walls = [table.wall[row] for row in rows]
    median = statistics.median(walls) if walls else 0
    slow = sorted(
        (
            row
            for row in rows
            if table.wall[row] > SLOW_FACTOR * median and table.wall[row] - median > SLOW_MIN_NS
        ),
        key=lambda row: table.wall[row],
        reverse=True,
    )[:NOTABLE]
    return set(failed) | set(non_finite) | set(slow)


def outline(tables: list[step_table.StepTable], sessions: set[str]) -> Outline:
    """What to show of the processes ``tables`` describe (``sessions``: the ids of their
    sessions, never left out, whatever holds steps directly)."""
    found = Outline()
    for table in tables:
        rows = table.steps()
        found.steps += len(rows)
        worth = notable(table, rows)
        groups: dict[str | None, list[int]] = {}  # by parent (the epoch), in start order
        for row in rows:
            groups.setdefault(table.parents[row], []).append(row)
        order = list(groups)
        shown_groups = {order[0], order[-1]} | {table.parents[row] for row in worth}
        shown_groups |= {parent for parent in order if parent in sessions or parent is None}
        hidden_groups: list[str | None] = []
        for parent in order:
            members = groups[parent]
            if parent not in shown_groups:
                hidden_groups.append(parent)
                found.hidden.update(table.ids[row] for row in members)
                continue
            _flush_epochs(found, table, groups, hidden_groups)
            hidden_groups = []
            keep = set(members[:EDGE] + members[-EDGE:]) | (worth & set(members))
            run: list[int] = []
            for row in members:
                if row in keep:
                    _flush_steps(found, table, run, parent)
                    run = []
                    found.shown.add(table.ids[row])
                else:
                    run.append(row)
                    found.hidden.add(table.ids[row])
            _flush_steps(found, table, run, parent)
        _flush_epochs(found, table, groups, hidden_groups)
    return found


def _flush_steps(
    found: Outline, table: step_table.StepTable, run: list[int], parent: str | None
) -> None:
    if run:
        what = "step" if table.kind[run[0]] == step_table.STEP else "batch"
        what = what if len(run) == 1 else ("steps" if what == "step" else "batches")
        line = f"... {len(run):,} {what} like these ..."
        found.lines.append((parent, line, table.start[run[0]]))


def _flush_epochs(
    found: Outline,
    table: step_table.StepTable,
    groups: dict[str | None, list[int]],
    hidden: list[str | None],
) -> None:
    if not hidden:
        return
    found.hidden.update(parent for parent in hidden if parent)
    steps = sum(len(groups[parent]) for parent in hidden)
    first = groups[hidden[0]][0]
    what = "steps" if table.kind[first] == step_table.STEP else "batches"
    epochs = "epoch" if len(hidden) == 1 else "epochs"
    line = f"... {len(hidden):,} {epochs} like these ({steps:,} {what}) ..."
    found.lines.append((None, line, table.start[first]))


def read_outlined(
    files: list[str], found: Outline, on_problem: Callable[[spool_reader.Problem], None]
) -> list[Any]:
    """The spans of ``files`` that the outline shows: not the steps and epochs it leaves
    out, nor anything below them."""
    keep = _Keep(found.hidden)
    spans: list[Any] = []
    for name in files:
        read = spool_reader.read_file(name, keep=keep)
        if read.problem is not None:
            on_problem(read.problem)
        spans += read.spans
    # What was below a span left out (a forward under an optimizer_step under a step) ends
    # before it, so it was read before its parent was known to be left out.
    left_out: set[str | None] = set(keep.left_out)
    while True:
        below = {_hex(span.context) for span in spans if _hex(span.parent) in left_out}
        if not below:
            return spans
        left_out |= below
        spans = [span for span in spans if _hex(span.context) not in below]


def _hex(context: Any) -> str | None:
    return format(context.span_id, "016x") if context is not None else None


class _Keep:
    """Leaves out the spans the outline hides and their children (ids in ``left_out``)."""

    def __init__(self, hidden: set[str]) -> None:
        self.hidden = hidden
        self.left_out: set[str] = set()

    def line(self, line: str) -> bool:
        ids = spool_reader.span_line_ids(line)
        return True if ids is None else self._keep(ids[0], ids[1])

    def __call__(self, span: dict[str, Any]) -> bool:
        return self._keep(span.get("spanId"), span.get("parentSpanId"))

    def _keep(self, span_id: Any, parent: Any) -> bool:
        if span_id in self.hidden or parent in self.hidden:
            self.left_out.add(span_id)
            return False
        return True


def render(spans: list[Any], found: Outline) -> str:
    """The tree of ``spans`` with a line for each run of steps and epochs left out."""
    roots, pairs = readback._tree(sorted(spans, key=readback._end_time), None)
    by_id = {node["span_id"]: node for node, _span in pairs}
    for parent, line, start in found.lines:
        node = readback.placeholder(line, start)
        holder = by_id.get(parent) if parent else None
        if holder is None:  # epochs left out: beside the epochs shown
            holder = _epochs_parent(roots)
        if holder is None:
            roots.append(node)
        else:
            holder["children"].append(node)
            holder["children"].sort(key=lambda child: child["start_ns"])
    return readback.text_of(roots, lines.OPEN_STOPPED)


def _epochs_parent(roots: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The node the epochs hang under (the session), if any."""
    for node, _depth in readback._walk(roots):
        if any(child["name"] == semconv.EPOCH for child in node["children"]):
            return node
    return None
