"""The findings about the ranks of a run: the rank the others wait for, and ranks that
recorded different numbers of steps (see :mod:`cirron.offline.findings`; the figures are
:mod:`cirron.offline.ranks`'s). A run of one process has none of these."""

from __future__ import annotations

import statistics
from collections import Counter

from ..otel import semconv
from .finding import INFO, WARNING, Finding, ms, plural
from .ranks import COMMUNICATION, WORDS, Alignment, align, communication_op
from .runs import Run
from .steps import span_id

MOSTLY = 0.5  # the slowest rank in this share of the steps or more: it is the straggler ...
MATTERS_NS = 1_000_000  # ... and worth a warning when it costs this much at the median ...
MATTERS_SHARE = 0.05  # ... and this share of the median step
WAITED = 0.5  # the others waited in collectives for this share of the spread or more

ACTIONS = {  # what to look at on the straggler, by the part that explains it
    semconv.DATA_LOAD: "feed that rank faster: its DataLoader (num_workers, the storage or "
    "shard it reads, a transform that is slow on its samples)",
    semconv.FORWARD: "compare that rank's forward with another's: its device (clocks, "
    "temperature, another job on it), and its batches (longer sequences, uneven shapes)",
    semconv.BACKWARD: "compare that rank's backward with another's: its device, and whether "
    "its batches are larger than the others'",
    semconv.OPTIMIZER_STEP: "look at what that rank does in its optimizer step that the others "
    "do not (a rank-0-only step, a sync)",
    "other": "look at what that rank runs outside the hooks each step (logging, metrics, a "
    "checkpoint on rank 0): wrap it in `ci.scope(...)` to see it",
}


def rank_findings(run: Run) -> list[Finding]:
    """The findings about ``run``'s ranks (none for one process)."""
    alignment = align(run)
    if alignment is None:
        return []
    found = []
    if alignment.uneven:
        found.append(_uneven(alignment))
    if alignment.steps:
        found.append(_straggler(alignment))
    return found


def _uneven(alignment: Alignment) -> Finding:
    counts = alignment.counts
    most = max(counts.values())
    short = {label: count for label, count in counts.items() if count < most}
    said = ", ".join(f"{label}: {count}" for label, count in short.items())
    return Finding(
        WARNING,
        f"The ranks recorded different numbers of steps ({said}; the others: {most}): "
        f"a rank stopped early or crashed. They are compared over the first "
        f"{plural(alignment.steps, 'step')}.",
        "look at the end of the rank that stopped first: its `cirron show --rank N` tree, "
        "and its log",
        "ranks",
        {"step_counts": counts, "compared_steps": alignment.steps},
    )


def _straggler(alignment: Alignment) -> Finding:
    ranks, steps = alignment.ranks, alignment.steps
    index, count = Counter(alignment.slowest).most_common(1)[0]
    rank = ranks[index]
    share = count / steps
    own_median = statistics.median(  # its own time less the others' median (not its own too)
        rank.own_ns(n) - statistics.median(r.own_ns(n) for r in ranks if r is not rank)
        for n in range(steps)
    )
    where = [n for n in range(steps) if alignment.slowest[n] == index]
    part = Counter(alignment.explained_by[n] for n in where).most_common(1)[0][0]
    waited = statistics.median(
        statistics.median(r.parts.columns[COMMUNICATION][n] for r in ranks if r is not rank)
        for n in where
    )
    spread = statistics.median(alignment.spread_ns[n] for n in where)
    step_median = statistics.median(rank.parts.walls[:steps])
    matters = share >= MOSTLY and own_median >= max(MATTERS_NS, MATTERS_SHARE * step_median)
    others_waited = matters and spread > 0 and waited >= WAITED * spread
    text = (
        f"{rank.label} was the slowest in {round(100 * share)}% of "
        f"{plural(steps, 'step')}, +{ms(own_median)} at the median, in {WORDS[part]}"
    )
    if others_waited:
        op = communication_op(next(r for r in ranks if r is not rank))
        text += f"; the other ranks spent that time waiting in {op}"
    figures = {
        "rank": rank.label,
        "share": share,
        "excess_ns": own_median,
        "part": part,
        "others_waiting_ns": waited,
        "compared_steps": steps,
    }
    worst = max(where, key=lambda n: alignment.spread_ns[n])
    return Finding(
        WARNING if matters else INFO,
        text + ("." if matters else ": no rank holds the others back."),
        ACTIONS.get(part, ACTIONS["other"]) if matters else "",
        "ranks",
        figures,
        [span_id(rank.timeline.steps[worst].span)],
    )
