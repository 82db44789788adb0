"""A row per step, made as the spans are written: what a step's figures need, without its spans.

The spool exporter hands each batch of spans to a :class:`StepFold` on the sink's thread.
Spans end children first (a step ends after its forward, backward, ...), so the fold works
bottom-up: each span that ends leaves its parent a summary of its subtree, and when a
``step`` or ``batch`` span ends its row is complete. A row holds what
:class:`cirron.offline.steps.Timeline` says of that step read from its spans: its time in
each part (each interval counted once: a part nested in another is that part's time, not
its parent's too, exactly as ``Timeline.parts`` walks it), whether it records its wait for
data, its status, its numeric attributes (CPU time, memory, ``skipped``, ...) and its marks.

A summary is, for each part the walk may be inside at the parent (none, or one of
:data:`semconv.STEP_PARTS`), the nanoseconds the subtree adds to each part: a part span
adds its duration to its own part and takes it from the one it is inside, unless it is
inside a part of its own name, where its time is already counted.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from operator import add
from typing import Any

from opentelemetry.trace import StatusCode

from ..otel import semconv
from ..otel.spans import ScopeSpan, span_ids

PARTS = semconv.STEP_PARTS
_PART = {name: position for position, name in enumerate(PARTS)}
_CONTEXTS = len(PARTS) + 1  # the walk is inside no part (0), or inside PARTS[k] (k + 1)
_ROW_NAMES = {semconv.STEP: 0, semconv.BATCH: 1}  # the row's kind
# Summaries kept for spans not ended yet; a parent that never ends (another process's, a
# span that was dropped) must not hold memory for ever.
MAX_PENDING = 100_000
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_STATUS_VALUES = {code: code.value for code in StatusCode}  # (an enum's .value is a Python call)
COLUMNS = ("id", "parent", "kind", "index", "start", "wall", "status", "waits", "whole", *PARTS)

# A summary, flat: [context * NP + part] for the NP parts in each of the contexts, then a
# count of the data_load spans below, then the time of the part spans with nothing below
# them (the common case: a step's forward, backward, ...) by part, kept apart because what
# such a span adds in each context follows from its part and time alone (:func:`_context`).
NP = len(PARTS)
_WAITS_AT = _CONTEXTS * NP
_LEAVES_AT = _WAITS_AT + 1
_SIZE = _LEAVES_AT + NP
Summary = list[int]
_DATA_LOAD = _PART[semconv.DATA_LOAD]
_NO_PARTS = (0,) * NP  # a step with no part below it


def _context(summary: Summary, context: int) -> list[int]:
    """What ``summary`` adds to each part in ``context`` (0: in no part, k + 1: in part k):
    a part span adds its time to its part, taken from the part the context is inside, unless
    that is its own."""
    at = context * NP
    found = summary[at : at + NP]
    for part in range(NP):
        took = summary[_LEAVES_AT + part]
        if took and context != part + 1:
            found[part] += took
            if context:
                found[context - 1] -= took
    return found


def _number(value: Any) -> Any:
    """A JSON-safe number: non-finite floats as OTLP/JSON writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[str(value)]
    return value


def _by_end(spans: Sequence[Any]) -> list[Any]:
    """``spans`` in the order they ended (stably); one with no end, at its start."""
    try:
        return sorted(spans, key=_END_OF)  # a key read in C: the common case
    except TypeError:  # ends and no ends (None) compared
        return sorted(spans, key=_end_key)


_END_OF = operator.attrgetter("_end_time")  # (SDK spans and cirron's keep it so)


def _end_key(span: Any) -> int:
    end = span._end_time  # (SDK spans and cirron's keep it so)
    return end if end is not None else span._start_time  # type: ignore[no-any-return]


class StepFold:
    """Folds one process's spans, batch by batch, into step rows."""

    def __init__(self) -> None:
        self._pending: dict[int, Summary] = {}
        self._trace: int | None = None

    def rows(self, spans: Sequence[Any]) -> dict[str, Any] | None:
        """The rows of the steps among ``spans`` (in the order they ended), as columns; None
        when there are none."""
        table: list[tuple[Any, ...]] = []  # a row a step, in COLUMNS' order; columns at the end
        attributes: dict[str, list[list[Any]]] = {}
        marks: dict[str, list[list[Any]]] = {}
        traces: list[list[Any]] = []
        self._trace = None  # each flush's rows name their first trace
        resource = None
        pending = self._pending
        for span in _by_end(spans):
            if type(span) is ScopeSpan:  # span_ids, inline: this runs for every span of a run
                span_id, parent = span._span_id, span._parent_span
                if parent is None:
                    parent_id = None
                elif type(parent) is ScopeSpan:
                    parent_id = parent._span_id
                else:
                    parent_id = parent.get_span_context().span_id
            else:
                span_id, parent_id = span_ids(span)
            below = pending.pop(span_id, None)
            name = span._name
            if name in _ROW_NAMES:
                self._row(span, span_id, parent_id, below, table, attributes, marks, traces)
                resource = resource or span.resource
            if parent_id is None:
                continue
            part = _PART.get(name)
            if part is None and below is None:
                continue  # nothing to carry
            target = pending.get(parent_id)
            if target is None:
                if len(pending) >= MAX_PENDING:  # the oldest first
                    del pending[next(iter(pending))]
                target = pending[parent_id] = [0] * _SIZE
            if part is None:  # not a part: its children count as they would at its parent
                for position, value in enumerate(below):  # type: ignore[arg-type]
                    if value:
                        target[position] += value
                continue
            if below is not None:  # inside it, the walk is in its part, in every context
                inner = _context(below, part + 1)
                for context in range(_CONTEXTS):
                    at = context * NP
                    for position in range(NP):
                        target[at + position] += inner[position]
                target[_WAITS_AT] += below[_WAITS_AT]
            end = span._end_time
            target[_LEAVES_AT + part] += end - span._start_time if end is not None else 0
            if part == _DATA_LOAD:
                target[_WAITS_AT] += 1
        if resource is None:
            return None
        columns = dict(zip(COLUMNS, map(list, zip(*table, strict=True)), strict=True))
        described = {
            k: list(v) if isinstance(v, tuple) else v for k, v in resource.attributes.items()
        }
        return {
            "resource": described,
            "rows": pack_rows(columns),
            "attributes": {key: pack(pairs, columns) for key, pairs in attributes.items()},
            "marks": {name: pack(triples, columns) for name, triples in marks.items()},
            "traces": traces,
        }

    def _row(
        self,
        span: Any,
        span_id: int,
        parent_id: int | None,
        below: Summary | None,
        table: list[tuple[Any, ...]],
        attributes: dict[str, list[list[Any]]],
        marks: dict[str, list[list[Any]]],
        traces: list[list[Any]],
    ) -> None:
        """Append ``span``'s row. ``whole``: the row holds all of the span a step's figures
        read (numeric attributes, number marks, no error, no link), so a reader may stand the
        row in for the span; ``traces``: the trace id where it changes from the row before.

        On the sink's thread for every step: fields are read directly (SDK spans and cirron's
        keep them so), not through properties that copy them."""
        row = len(table)
        start, end = span._start_time, span._end_time
        own = span._attributes or {}
        code = span._status.status_code
        status = code is StatusCode.ERROR
        index = own.get(semconv.INDEX)
        if type(index) is not int:
            index = None
        totals: Sequence[int]
        if below is None:
            totals = _NO_PARTS
            waits = semconv.DATA_LOAD_NS in own
        else:  # the walk from the step is in no part: context 0
            totals = _context(below, 0)
            waits = bool(below[_WAITS_AT]) or semconv.DATA_LOAD_NS in own
        whole = end is not None and not status and not span._links
        if whole and type(span) is not ScopeSpan:  # (cirron's own spans drop nothing)
            whole = not (span.dropped_attributes or span.dropped_events)
        for key, value in own.items():
            if key == semconv.INDEX and index is not None:
                continue
            kind = type(value)
            if kind is int or kind is float or kind is bool or isinstance(value, (int, float)):
                found = attributes.get(key)
                if found is None:
                    found = attributes[key] = []
                found.append([row, _number(value)])
            else:
                whole = False  # a text, a list: only its span has it
        for event in span._events:
            held = event._attributes or {}
            value = held.get(semconv.MARK_VALUE)
            kind = type(value)
            if kind is float or kind is int:
                found = marks.get(event._name)
                if found is None:
                    found = marks[event._name] = []
                found.append([row, _number(value), event._timestamp])
                if len(held) != 1:
                    whole = False
            else:
                whole = False  # an exception, a mark of text
        table.append((
            span_id, parent_id, _ROW_NAMES[span._name], index, start,
            end - start if end is not None else 0, _STATUS_VALUES[code], 1 if waits else 0,
            1 if whole else 0, *totals,
        ))  # fmt: skip
        trace = span._trace_id if type(span) is ScopeSpan else span.get_span_context().trace_id
        if trace != self._trace:
            self._trace = trace
            traces.append([row, format(trace, "032x")])


# -- packing: numbers that compress (what follows is mostly the same small numbers) ---------
def pack_rows(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``start`` as the gap since the previous row's end (0 for steps that abut), ``index``
    as the step from the previous row's (1 for consecutive steps); see :func:`unpack_rows`."""
    packed = dict(columns)
    packed["id"] = [f"{span_id:016x}" for span_id in columns["id"]]
    packed["parent"] = [None if p is None else f"{p:016x}" for p in columns["parent"]]
    starts, walls = columns["start"], columns["wall"]
    packed["start"] = [starts[0]] + [
        starts[row] - starts[row - 1] - walls[row - 1] for row in range(1, len(starts))
    ]
    indexes, previous = [], 0
    for index in columns["index"]:
        indexes.append(None if index is None else index - previous)
        previous = index if index is not None else previous
    packed["index"] = indexes
    return packed


def unpack_rows(packed: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The columns :func:`pack_rows` packed."""
    columns = dict(packed)
    starts, walls = packed["start"], packed["wall"]
    # (itertools: a million steps' rows are read at C speed, the same sums as a loop's)
    columns["start"] = list(itertools.accumulate(starts[:1] + list(map(add, walls, starts[1:]))))
    if None not in packed["index"]:
        columns["index"] = list(itertools.accumulate(packed["index"]))
        return columns
    indexes: list[int | None] = []
    previous = 0
    for step in packed["index"]:
        if step is None:
            indexes.append(None)
        else:
            previous += step
            indexes.append(previous)
    columns["index"] = indexes
    return columns


def pack(items: list[list[Any]], columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Sparse ``[row, value(, time)]`` items as columns: ``row`` as the step from the
    previous item's row, ``at`` (a mark's time) as nanoseconds before its row's end."""
    rows = [item[0] for item in items]
    packed: dict[str, list[Any]] = {
        "row": [rows[0]] + [row - before for before, row in zip(rows, rows[1:], strict=False)],
        "value": [item[1] for item in items],
    }
    if items and len(items[0]) > 2:
        ends = [columns["start"][row] + columns["wall"][row] for row in rows]
        packed["at"] = [end - item[2] for end, item in zip(ends, items, strict=True)]
    return packed


def unpack(
    packed: dict[str, list[Any]], starts: list[int], walls: list[int]
) -> tuple[list[int], list[Any], list[int] | None]:
    """The rows, values and times (None: no ``at``) of the items :func:`pack` packed, given
    the rows' columns, as columns."""
    rows, values = list(itertools.accumulate(packed["row"])), packed["value"]
    if len(rows) != len(values):
        raise ValueError("packed rows and values differ in length")
    if "at" not in packed:
        return rows, values, None
    times = [starts[row] + walls[row] - at for row, at in zip(rows, packed["at"], strict=True)]
    return rows, values, times
