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

import math
from collections.abc import Sequence
from typing import Any

from ..otel import semconv

PARTS = semconv.STEP_PARTS
_PART = {name: position for position, name in enumerate(PARTS)}
_CONTEXTS = len(PARTS) + 1  # the walk is inside no part (0), or inside PARTS[k] (k + 1)
_WAITS = len(PARTS)  # the summary's last slot: whether the subtree holds a data_load
_ROW_NAMES = {semconv.STEP: 0, semconv.BATCH: 1}  # the row's kind
# Summaries kept for spans not ended yet; a parent that never ends (another process's, a
# span that was dropped) must not hold memory for ever.
MAX_PENDING = 100_000
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

Summary = list[list[int]]  # [context][part], and [0][_WAITS]: a data_load below


def _number(value: Any) -> Any:
    """A JSON-safe number: non-finite floats as OTLP/JSON writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[str(value)]
    return value


class StepFold:
    """Folds one process's spans, batch by batch, into step rows."""

    def __init__(self) -> None:
        self._pending: dict[int, Summary] = {}

    def rows(self, spans: Sequence[Any]) -> dict[str, Any] | None:
        """The rows of the steps among ``spans`` (in the order they ended), as columns; None
        when there are none."""
        columns: dict[str, list[Any]] = {
            key: [] for key in ("id", "parent", "kind", "index", "start", "wall", "status", "waits")
        }
        for part in PARTS:
            columns[part] = []
        attributes: dict[str, list[list[Any]]] = {}
        marks: dict[str, list[list[Any]]] = {}
        resource = None
        for span in sorted(spans, key=_end_time):
            context = span.get_span_context()
            below = self._pending.pop(context.span_id, None)
            name = span.name
            if name in _ROW_NAMES:
                self._row(span, context, below, columns, attributes, marks)
                resource = resource or span.resource
            parent = span.parent
            if parent is not None:
                self._carry(parent.span_id, _seen_from_above(name, span, below))
        if resource is None:
            return None
        described = {
            k: list(v) if isinstance(v, tuple) else v for k, v in resource.attributes.items()
        }
        return {
            "resource": described,
            "rows": pack_rows(columns),
            "attributes": {key: pack(pairs, columns) for key, pairs in attributes.items()},
            "marks": {name: pack(triples, columns) for name, triples in marks.items()},
        }

    def _row(
        self,
        span: Any,
        context: Any,
        below: Summary | None,
        columns: dict[str, list[Any]],
        attributes: dict[str, list[list[Any]]],
        marks: dict[str, list[list[Any]]],
    ) -> None:
        row = len(columns["id"])
        start, end = span.start_time, span.end_time
        own = span.attributes or {}
        parent = span.parent
        columns["id"].append(format(context.span_id, "016x"))
        columns["parent"].append(format(parent.span_id, "016x") if parent is not None else None)
        columns["kind"].append(_ROW_NAMES[span.name])
        index = own.get(semconv.INDEX)
        columns["index"].append(index if isinstance(index, int) else None)
        columns["start"].append(start)
        columns["wall"].append(end - start if end is not None else 0)
        columns["status"].append(span.status.status_code.value)
        totals = below[0] if below is not None else None
        for position, part in enumerate(PARTS):
            columns[part].append(totals[position] if totals is not None else 0)
        waits = bool(totals is not None and totals[_WAITS]) or semconv.DATA_LOAD_NS in own
        columns["waits"].append(int(waits))
        for key, value in own.items():
            if key != semconv.INDEX and isinstance(value, (int, float)):  # bools too
                attributes.setdefault(key, []).append([row, _number(value)])
        for event in span.events:
            value = (event.attributes or {}).get(semconv.MARK_VALUE)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                marks.setdefault(event.name, []).append([row, _number(value), event.timestamp])

    def _carry(self, parent_id: int, summary: Summary | None) -> None:
        if summary is None:
            return
        held = self._pending.get(parent_id)
        if held is None:
            if len(self._pending) >= MAX_PENDING:  # the oldest first
                del self._pending[next(iter(self._pending))]
            self._pending[parent_id] = summary
            return
        for mine, theirs in zip(held, summary, strict=True):
            for position, value in enumerate(theirs):
                if value:
                    mine[position] += value


# -- packing: numbers that compress (what follows is mostly the same small numbers) ---------
def pack_rows(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``start`` as the gap since the previous row's end (0 for steps that abut), ``index``
    as the step from the previous row's (1 for consecutive steps); see :func:`unpack_rows`."""
    packed = dict(columns)
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
    starts: list[int] = []
    walls = packed["wall"]
    for row, value in enumerate(packed["start"]):
        starts.append(value if not row else starts[-1] + walls[row - 1] + value)
    columns["start"] = starts
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


def unpack(packed: dict[str, list[Any]], starts: list[int], walls: list[int]) -> list[list[Any]]:
    """The ``[row, value(, time)]`` items :func:`pack` packed, given the rows' columns."""
    rows, row = [], 0
    for step in packed["row"]:
        row += step
        rows.append(row)
    if "at" not in packed:
        return [[row, value] for row, value in zip(rows, packed["value"], strict=True)]
    return [
        [row, value, starts[row] + walls[row] - at]
        for row, value, at in zip(rows, packed["value"], packed["at"], strict=True)
    ]


def _end_time(span: Any) -> int:
    return span.end_time if span.end_time is not None else span.start_time


def _seen_from_above(name: str, span: Any, below: Summary | None) -> Summary | None:
    """What the subtree of ``span`` adds to each part, for each part its parent may be in."""
    part = _PART.get(name)
    if part is None:
        return below  # not a part: its children count as they would at its parent
    took = span.end_time - span.start_time if span.end_time is not None else 0
    inner = below[part + 1] if below is not None else [0] * (len(PARTS) + 1)
    waits = 1 if part == _PART[semconv.DATA_LOAD] or (below and below[0][_WAITS]) else 0
    summary: Summary = []
    for context in range(_CONTEXTS):
        seen = list(inner)
        if context != part + 1:  # a part boundary: its time is its own
            seen[part] += took
            if context:
                seen[context - 1] -= took
        seen[_WAITS] = waits
        summary.append(seen)
    return summary
