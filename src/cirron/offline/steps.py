"""The steps of one process, read back: what the findings and the report's charts are made of.

A process's steps are its ``step`` spans (an optimizer moment each), else its ``batch``
spans (Keras, ``ci.batches``), in start order, numbered from 0 across the whole run: a
Keras run's batch indexes restart each epoch, the global number does not. Every figure
here is a sum of intervals counted once: a part nested in another part (Lightning runs
``forward`` and ``backward`` inside ``optimizer_step``'s closure) is that part's time, not
its parent's too.
"""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..otel import semconv

OTHER = "other"  # the share of a step no part accounts for


def duration_ns(span: Any) -> int:
    end = span.end_time
    return end - span.start_time if end is not None else 0


def span_id(span: Any) -> str:
    return format(span.context.span_id, "016x")


def is_error(span: Any) -> bool:
    return bool(span.status.status_code.name == "ERROR")


def named_parent(span: Any) -> int | None:
    """The id of ``span``'s parent: its parent's, or for a long run's epoch that begins a
    trace of its own, the one its attribute names."""
    if span.parent is not None:
        return int(span.parent.span_id)
    named = (span.attributes or {}).get(semconv.PARENT_SPAN_ID)
    try:
        return int(named, 16) if isinstance(named, str) else None
    except ValueError:
        return None


def _stands_in(span: Any) -> bool:
    """Whether ``span`` is a step's row standing in for its span (and its parts)."""
    return getattr(span, "stands_in", False) is True


def _acyclic_parents(spans: list[Any], by_id: dict[int, Any]) -> dict[int, Any]:
    """span id -> its parent span, for the spans whose parent is here; a span in a parent
    cycle (its own parent, or A -> B -> A: only a damaged or forged spool has one) has none,
    so every walk up or down the tree ends."""
    parents = {}
    for span in spans:
        if _stands_in(span):
            continue  # (see Timeline.parent)
        parent = by_id.get(named_parent(span))  # type: ignore[arg-type]
        if parent is not None:
            parents[span.context.span_id] = parent
    ends: set[int] = set()  # spans whose walk up is known to end
    for start in list(parents):
        path, key = {start}, start
        while key not in ends:
            above = parents.get(key)
            if above is None:
                break
            if above.context.span_id in path:  # a cycle: cut it where it closes
                parents.pop(key, None)
                break
            key = above.context.span_id
            path.add(key)
        ends.update(path)
    return parents


@dataclass(slots=True)
class Step:
    number: int  # 0, 1, ... across the run (this process's)
    span: Any
    epoch: Any  # the epoch span it belongs to, or None
    first_of_epoch: bool

    @property
    def index(self) -> Any:
        return (self.span.attributes or {}).get(semconv.INDEX, self.number)

    @property
    def wall_ns(self) -> int:
        """Its span's duration: read by every figure (a step's row holds it as it is)."""
        span = self.span
        return span.wall_ns if _stands_in(span) else duration_ns(span)  # type: ignore[no-any-return]


class Timeline:
    """One process's spans, indexed: children, epochs, steps.

    ``table``: the process's step rows (:class:`cirron.offline.step_table.StepTable`), read
    from the spool's index: each step's parts and wait for data come from its row, so the
    spans need not hold the steps' ``forward``, ``backward``, ... (see
    :func:`cirron.offline.spool_read.read_run`). A step with no row is walked as without.
    """

    def __init__(self, spans: list[Any], table: Any = None) -> None:
        self.spans = sorted(spans, key=lambda s: s.start_time)
        # Rows by span id, for the steps read as spans (a RowSpan knows its row).
        self._rows: dict[int, int] = table.rows_by_id(whole=False) if table is not None else {}
        self._table = table
        self.by_id = {span.context.span_id: span for span in self.spans}
        self._parents = _acyclic_parents(self.spans, self.by_id)
        self.children: dict[int, list[Any]] = defaultdict(list)  # (read with .get: see walk)
        for span in self.spans:
            parent = self.parent(span)
            if parent is not None:
                self.children[parent.context.span_id].append(span)
        ended = [s for s in self.spans if s.end_time is not None]
        steps = [s for s in ended if s.name == semconv.STEP] or [
            s for s in ended if s.name == semconv.BATCH
        ]
        self.steps: list[Step] = []
        previous_epoch: Any = object()
        for number, span in enumerate(steps):
            epoch = self.enclosing(span, semconv.EPOCH)
            self.steps.append(Step(number, span, epoch, epoch is not previous_epoch))
            previous_epoch = epoch
        # (Arrays: a list of a million ints read from a step table's array holds 40 MB.)
        self._starts = array("q", [step.span.start_time for step in self.steps])
        self._span_starts = array("q", [span.start_time for span in self.spans])
        self._parts: dict[int, dict[str, int]] = {}  # by step number: read by several figures

    def _row(self, step: Step) -> int | None:
        """``step``'s row in the process's step table, if it has one."""
        if self._table is None:
            return None
        row = getattr(step.span, "row", None)
        return row if row is not None else self._rows.get(step.span.context.span_id)

    def parent(self, span: Any) -> Any:
        """The span's parent here, or None (not here, or the span is in a parent cycle)."""
        if _stands_in(span):  # a step's row: nothing below it is read, so it is in no cycle
            return self.by_id.get(named_parent(span))
        return self._parents.get(span.context.span_id)

    def started_within(self, start_ns: int, end_ns: int) -> list[Any]:
        """The spans that began in [start_ns, end_ns], in start order."""
        low = bisect.bisect_left(self._span_starts, start_ns)
        high = bisect.bisect_right(self._span_starts, end_ns)
        return self.spans[low:high]

    def enclosing(self, span: Any, name: str) -> Any:
        """The nearest ancestor of ``span`` named ``name``, or None."""
        above = self.parent(span)
        while above is not None:
            if above.name == name:
                return above
            above = self.parent(above)
        return None

    def descendants(self, span: Any) -> Iterator[Any]:
        stack = list(self.children.get(span.context.span_id, ()))
        while stack:
            child = stack.pop()
            yield child
            stack.extend(self.children.get(child.context.span_id, ()))

    def step_at(self, span: Any, time_ns: int) -> Step | None:
        """The step ``span`` is in (or is), else the step running at ``time_ns``."""
        above = span
        while above is not None:
            if above.name in (semconv.STEP, semconv.BATCH):
                for step in self._around(above.start_time):
                    if step.span is above:
                        return step
            above = self.parent(above)
        position = bisect.bisect_right(self._starts, time_ns) - 1
        if position >= 0:
            step = self.steps[position]
            if step.span.end_time is not None and time_ns <= step.span.end_time:
                return step
        return None

    def _around(self, start_ns: int) -> list[Step]:
        low = bisect.bisect_left(self._starts, start_ns)
        high = bisect.bisect_right(self._starts, start_ns)
        return self.steps[low:high]

    def parts(self, step: Step) -> dict[str, int]:
        """Nanoseconds of ``step`` in each part (``STEP_PARTS``) and in ``other``; each
        interval counted once (a part's time excludes the parts nested in it)."""
        known = self._parts.get(step.number)
        if known is not None:
            return known
        row = self._row(step)
        if row is not None:  # read from the row each time: a million cached dicts weigh 300 MB
            return self._table.part_times(row)  # type: ignore[no-any-return]
        totals = dict.fromkeys((*semconv.STEP_PARTS, OTHER), 0)

        def walk(span: Any, current: str | None) -> None:
            for child in self.children.get(span.context.span_id, ()):
                name = child.name
                if name in totals and name != OTHER and name != current:
                    took = duration_ns(child)
                    totals[name] += took
                    if current is not None:
                        totals[current] -= took
                    walk(child, name)
                else:
                    walk(child, current)

        walk(step.span, None)
        ns = (step.span.attributes or {}).get(semconv.DATA_LOAD_NS)
        if isinstance(ns, int) and not isinstance(ns, bool) and not totals[semconv.DATA_LOAD]:
            # ci.batches over a DataLoader, as recorded before its batch held its fetch
            totals[semconv.DATA_LOAD] += ns
        inside = sum(totals[part] for part in semconv.STEP_PARTS)
        totals[OTHER] = max(step.wall_ns - inside, 0)
        self._parts[step.number] = totals
        return totals

    def measures_waiting(self, step: Step) -> bool:
        """Whether ``step`` records its wait for data (a ``data_load`` in it, or its
        ``data_load_ns``): Keras on TensorFlow does not."""
        if semconv.DATA_LOAD_NS in (step.span.attributes or {}):
            return True
        row = self._row(step)
        if row is not None:
            return bool(self._table.waits[row])
        return any(span.name == semconv.DATA_LOAD for span in self.descendants(step.span))

    def waiting_ns(self, step: Step) -> int:
        """Nanoseconds of ``step`` spent waiting for its data."""
        return min(self.parts(step)[semconv.DATA_LOAD], step.wall_ns)
