"""The ranks of one run side by side: their steps aligned by step number, and which rank the
others waited for at each step (the straggler view).

In data-parallel training every rank waits for the slowest at each gradient all-reduce, so
the ranks' step times come out alike: the slow rank spends the time in its own work, the
others in communication. A rank's step is therefore split into its parts (:data:`PARTS`):
the parts :class:`~cirron.offline.steps.Timeline` counts, with the time spent waiting in
collectives (``collective`` spans) taken out of the part that holds them:

- a DDP bucket's all-reduce runs beside the backward's compute; the backward waits for it
  only after it queued its last bucket, so the wait is from the last bucket's start to the
  end of the last all-reduce (at most to the backward's end);
- a collective the program calls (``dist.all_reduce``, ``barrier``) waits for its whole length.

What is left, a rank's *own time* (the step's wall time less its communication wait), is
what the others wait for: at each step the rank with the most own time is the slowest, the
*spread* is its own time less the median of the other ranks' (of two ranks, the other's),
and the part in which it exceeds theirs by most is the part that explains it.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ..otel import semconv
from .runs import Process, Run
from .steps import OTHER, Step, Timeline

COMMUNICATION = "communication"  # the wait in collectives, a part of its own here
PARTS = (
    semconv.DATA_LOAD,
    semconv.FORWARD,
    semconv.BACKWARD,
    COMMUNICATION,
    semconv.OPTIMIZER_STEP,
    OTHER,
)
WORDS = {  # each part as a sentence names it
    semconv.DATA_LOAD: "data wait",
    semconv.FORWARD: semconv.FORWARD,
    semconv.BACKWARD: "backward compute",
    COMMUNICATION: "communication wait",
    semconv.OPTIMIZER_STEP: "optimizer step",
    OTHER: "other work",
}


# -- one rank's steps -----------------------------------------------------------------------
def _enclosing_part(timeline: Timeline, span: Any, step: Step) -> str:
    """The part a span's time counts in: its nearest ancestor that is a part, else other."""
    above = timeline.parent(span)
    while above is not None and above is not step.span:
        if above.name in semconv.STEP_PARTS:
            return str(above.name)
        above = timeline.parent(above)
    return OTHER


def step_parts(timeline: Timeline, step: Step) -> dict[str, int]:
    """Nanoseconds of ``step`` in each of :data:`PARTS`; they add up to its wall time."""
    parts = dict(timeline.parts(step))
    parts[COMMUNICATION] = 0
    buckets: dict[int, list[Any]] = {}  # a backward's id -> its buckets' all-reduces
    for span in timeline.descendants(step.span):
        if span.name != semconv.COLLECTIVE or span.end_time is None:
            continue
        parent = timeline.parent(span)
        if semconv.COLLECTIVE_BUCKET in (span.attributes or {}) and parent is not None:
            buckets.setdefault(parent.context.span_id, []).append(span)
            continue
        _move(parts, _enclosing_part(timeline, span, step), _clipped(span, step.span))
    for backward_id, reductions in buckets.items():
        backward = timeline.by_id[backward_id]
        last_start = max(span.start_time for span in reductions)
        done = max(span.end_time for span in reductions)
        if backward.end_time is not None:  # its callback may run a little after the wait
            done = min(done, backward.end_time)
        part = backward.name if backward.name in semconv.STEP_PARTS else OTHER
        _move(parts, str(part), max(done - last_start, 0))
    return parts


def _clipped(span: Any, within: Any) -> int:
    end = min(span.end_time, within.end_time or span.end_time)
    return max(end - max(span.start_time, within.start_time), 0)


def _move(parts: dict[str, int], source: str, ns: int) -> None:
    """``ns`` of ``source``'s time was communication wait (never more than it held)."""
    moved = min(ns, parts[source])
    parts[source] -= moved
    parts[COMMUNICATION] += moved


class StepParts(Sequence[dict[str, int]]):
    """Each step's nanoseconds by part (``parts[n]``, a dict made when asked), held as a
    column a part: 64 ranks of 10,000 steps as dicts weigh 230 MB, as columns 36."""

    def __init__(self, steps: Iterable[dict[str, int]]) -> None:
        self.columns = {part: array("q") for part in PARTS}
        self.walls = array("q")  # each step's parts added up: its wall time
        for parts in steps:
            for part, column in self.columns.items():
                column.append(parts[part])
            self.walls.append(sum(parts.values()))

    def __len__(self) -> int:
        return len(self.walls)

    @overload
    def __getitem__(self, number: int) -> dict[str, int]: ...
    @overload
    def __getitem__(self, number: slice) -> list[dict[str, int]]: ...
    def __getitem__(self, number: int | slice) -> dict[str, int] | list[dict[str, int]]:
        if isinstance(number, slice):
            return [self[n] for n in range(len(self))[number]]
        return {part: column[number] for part, column in self.columns.items()}


@dataclass
class RankSteps:
    """One rank (process) of a run: its steps and each step's parts."""

    process: Process
    timeline: Timeline
    parts: StepParts = field(default_factory=lambda: StepParts(()))  # by step number

    @property
    def label(self) -> str:
        return self.process.label

    def own_ns(self, number: int) -> int:
        """The step's wall time less its communication wait: what the others wait for."""
        return self.parts.walls[number] - self.parts.columns[COMMUNICATION][number]


# -- the ranks aligned ------------------------------------------------------------------------
@dataclass
class Alignment:
    """The ranks of a run with steps, aligned over the steps they all have."""

    ranks: list[RankSteps]
    steps: int  # steps every rank recorded: compared over 0 .. steps - 1
    counts: dict[str, int]  # each process's step count (0 for one without steps)
    slowest: list[int] = field(default_factory=list)  # per step: the index of its slowest rank
    spread_ns: list[int] = field(default_factory=list)  # per step: slowest own - others' median
    explained_by: list[str] = field(default_factory=list)  # per step: the part behind it

    @property
    def uneven(self) -> bool:
        return len(set(self.counts.values())) > 1


def align(run: Run) -> Alignment | None:
    """The straggler view of ``run``; None when it has fewer than two processes with steps.
    Worked out once a run."""
    if "alignment" not in run.worked_out:
        run.worked_out["alignment"] = _align(run)
    return run.worked_out["alignment"]  # type: ignore[no-any-return]


def _align(run: Run) -> Alignment | None:
    ranks = []
    counts = {}
    for process in run.processes:
        timeline = process.timeline()
        counts[process.label] = len(timeline.steps)
        if timeline.steps:
            ranks.append(RankSteps(process, timeline))
    if len(ranks) < 2:
        return None
    steps = min(len(rank.timeline.steps) for rank in ranks)
    for rank in ranks:
        rank.parts = StepParts(step_parts(rank.timeline, s) for s in rank.timeline.steps[:steps])
    alignment = Alignment(ranks, steps, counts)
    for number in range(steps):
        own = [rank.own_ns(number) for rank in ranks]
        slowest = max(range(len(ranks)), key=lambda i: own[i])
        alignment.slowest.append(slowest)
        others = own[:slowest] + own[slowest + 1 :]  # (with itself, two ranks' gap halves)
        alignment.spread_ns.append(own[slowest] - int(statistics.median(others)))
        alignment.explained_by.append(_explaining_part(ranks, number, slowest))
    return alignment


def _explaining_part(ranks: list[RankSteps], number: int, slowest: int) -> str:
    """The part in which the slowest rank exceeds the median of the others by most."""
    others = ranks[:slowest] + ranks[slowest + 1 :]
    excess = {
        part: ranks[slowest].parts.columns[part][number]
        - statistics.median(rank.parts.columns[part][number] for rank in others)
        for part in PARTS
        if part != COMMUNICATION
    }
    return max(excess, key=lambda part: excess[part])


# -- what a table says of each rank ---------------------------------------------------------------
def p95(values: list[int]) -> float:
    """The 95th percentile, nearest rank (the value itself for one value)."""
    ordered = sorted(values)
    return float(ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)])


@dataclass
class RankRow:
    label: str
    steps: int
    step: tuple[float, float]  # median and p95 of the step's wall time, ns
    parts: dict[str, tuple[float, float]]  # the same per part
    slowest_in: int  # steps where it was the slowest


def rows(alignment: Alignment) -> list[RankRow]:
    """One row per rank: median and p95 over the aligned steps, by part, and how often it
    was the slowest."""
    slowest = Counter(alignment.slowest)
    found = []
    for index, rank in enumerate(alignment.ranks):
        walls = list(rank.parts.walls)
        by_part = {
            part: (
                float(statistics.median(rank.parts.columns[part])),
                p95(list(rank.parts.columns[part])),
            )
            for part in PARTS
        }
        found.append(
            RankRow(
                rank.label,
                alignment.counts[rank.label],
                (float(statistics.median(walls)), p95(walls)),
                by_part,
                slowest[index],
            )
        )
    return found


def communication_op(rank: RankSteps) -> str:
    """What the rank's collectives mostly were, in words (``all-reduce``), or ``collectives``."""
    ops = Counter(
        str((span.attributes or {}).get(semconv.COLLECTIVE_OP, ""))
        for span in rank.timeline.spans
        if span.name == semconv.COLLECTIVE
    )
    if not ops:
        return "collectives"
    op = ops.most_common(1)[0][0]
    return op.replace("_", "-") if op and "," not in op else "collectives"


def _cell(pair: tuple[float, float]) -> str:
    return f"{pair[0] / 1e6:.3g}/{pair[1] / 1e6:.3g}"


def table(alignment: Alignment) -> str:
    """``cirron show --ranks``: a row per rank, its steps, step time and each part's as
    median/p95 in ms, and the steps where it was the slowest."""
    heads = ["", "steps", "step time", *(WORDS[part] for part in PARTS), "slowest in"]
    body = [
        [row.label, str(row.steps), _cell(row.step)]
        + [_cell(row.parts[part]) for part in PARTS]
        + [f"{row.slowest_in} of {alignment.steps}"]
        for row in rows(alignment)
    ]
    widths = [max(len(cells[i]) for cells in [heads, *body]) for i in range(len(heads))]
    lines = [f"{alignment.steps} steps lined up; each cell: median/p95 in ms"]
    for cells in [heads, *body]:
        first = cells[0].ljust(widths[0])
        rest = (text.rjust(width) for text, width in zip(cells[1:], widths[1:], strict=True))
        lines.append("  ".join([first, *rest]))
    return "\n".join(lines)


def as_json(alignment: Alignment) -> dict[str, Any]:
    """The table's figures, in ns."""
    return {
        "compared_steps": alignment.steps,
        "step_counts": alignment.counts,
        "ranks": [
            {
                "rank": row.label,
                "step_count": row.steps,
                "step_ns": {"median": row.step[0], "p95": row.step[1]},
                "parts_ns": {p: {"median": m, "p95": q} for p, (m, q) in row.parts.items()},
                "slowest_in": row.slowest_in,
            }
            for row in rows(alignment)
        ],
    }
