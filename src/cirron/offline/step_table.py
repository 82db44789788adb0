"""The steps of a spool as columns: each process's step rows, from the index or the spans.

The spool exporter writes a row per step as the run goes (:mod:`cirron.exporters.step_rows`,
in ``<path>/index/<pid>.steps.jsonl.gz``). A process whose every spool file has its line in
the index is read from its rows alone: a few dozen bytes a step, whatever its spans held.
Any other (a spool from before the index, a file whose line was lost) is read from its
spans, folded into the same rows by the same code, so the two ways agree on every figure.

The columns are Python ``array``s (8 bytes a number), so a million steps take tens of
megabytes.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import operator
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from ..exporters import spool_index, spool_reader
from ..exporters.step_rows import COLUMNS, PARTS, StepFold, unpack, unpack_rows
from ..otel import semconv
from .runs import label_of, process_key_of

STEP, BATCH = 0, 1  # a row's kind
_NUMBERS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass
class StepTable:
    """One process's step and batch rows, in the order they ended."""

    label: str
    rank: int | None
    resource: dict[str, Any]
    key: tuple[Any, ...] = ()  # the process's (cirron.offline.runs.process_key_of)
    ids: list[str] = field(default_factory=list)
    parents: list[str | None] = field(default_factory=list)
    kind: array = field(default_factory=lambda: array("b"))
    index: array = field(default_factory=lambda: array("q"))  # -1: none
    start: array = field(default_factory=lambda: array("q"))
    wall: array = field(default_factory=lambda: array("q"))
    status: array = field(default_factory=lambda: array("b"))
    waits: array = field(default_factory=lambda: array("b"))
    whole: array = field(default_factory=lambda: array("b"))  # the row stands for its span
    traces: list[tuple[int, str]] = field(default_factory=list)  # (row, trace id) from there
    parts: dict[str, array] = field(default_factory=lambda: {p: array("q") for p in PARTS})
    attributes: dict[str, dict[int, Any]] = field(default_factory=dict)  # key -> row -> value
    marks: dict[str, Marks] = field(default_factory=dict)
    _parents_seen: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    def rows_by_id(self, whole: bool = True) -> dict[int, int]:
        """Each row by its span id (as an int, as SDK spans hold it); ``whole=False``: only
        the rows that do not stand for their spans."""
        return {
            int(span_id, 16): row
            for row, span_id in enumerate(self.ids)
            if whole or not self.whole[row]
        }

    def add(self, rows: dict[str, Any]) -> None:
        """Append a flush's rows (as :class:`StepFold` makes them)."""
        offset = len(self.ids)
        columns = unpack_rows(rows["rows"])
        self.ids += columns["id"]
        known = self._parents_seen
        self.parents += [known.setdefault(p, p) for p in columns["parent"]]  # one str an epoch
        self.kind.extend(columns["kind"])
        indexes = columns["index"]
        self.index.extend(
            indexes if None not in indexes else [-1 if i is None else i for i in indexes]
        )
        self.start.extend(columns["start"])
        self.wall.extend(columns["wall"])
        self.status.extend(columns["status"])
        self.waits.extend(columns["waits"])
        self.whole.extend(columns["whole"])
        self.traces += [(offset + row, trace) for row, trace in rows.get("traces") or ()]
        for part in PARTS:
            self.parts[part].extend(columns[part])
        starts, walls = columns["start"], columns["wall"]
        shift = functools.partial(operator.add, offset)  # (a million rows: at C speed)
        for key, packed in rows["attributes"].items():
            found, values, _times = unpack(packed, starts, walls)
            held = self.attributes.setdefault(key, {})
            held.update(zip(map(shift, found), map(_number, values), strict=True))
        for name, packed in rows["marks"].items():
            found, values, times = unpack(packed, starts, walls)
            if times is None:
                raise ValueError(f"the mark {name!r} has no times")
            self.marks.setdefault(name, Marks()).extend(map(shift, found), values, times)

    def partial_ids(self) -> set[str]:
        """The span ids of the rows that do not stand for their spans."""
        return {span_id for span_id, whole in zip(self.ids, self.whole, strict=True) if not whole}

    def row_spans(self, resource: Any) -> list[RowSpan]:
        """A span for each row that stands for its span: what the findings read of a step
        span, from the row (its resource: ``resource``, the process's)."""
        trace_rows = [row for row, _trace in self.traces]
        trace_ids = [int(trace, 16) for _row, trace in self.traces]
        parents: dict[tuple[int, str], SpanContext] = {}  # one for the steps of an epoch
        found = []
        for row, span_id in enumerate(self.ids):
            if not self.whole[row]:
                continue
            at = bisect.bisect_right(trace_rows, row) - 1
            trace = trace_ids[at] if at >= 0 else 0
            parent = self.parents[row]
            above = None
            if parent:
                above = parents.get((trace, parent))
                if above is None:
                    above = parents[trace, parent] = SpanContext(trace, int(parent, 16), False)
            found.append(
                RowSpan(
                    semconv.BATCH if self.kind[row] == BATCH else semconv.STEP,
                    SpanContext(trace, int(span_id, 16), False),
                    above,
                    self,
                    row,
                    resource,
                )
            )
        return found

    def events_of(self, row: int) -> tuple[RowEvent, ...]:
        """The marks of ``row``'s span, as span events."""
        found = []
        for name, marks in self.marks.items():
            at = bisect.bisect_left(marks.rows, row)
            while at < len(marks.rows) and marks.rows[at] == row:
                found.append(RowEvent(name, marks.values[at], marks.times[at]))
                at += 1
        found.sort(key=lambda event: event.timestamp)
        return tuple(found)

    def attributes_of(self, row: int) -> dict[str, Any]:
        """The attributes of ``row``'s span that the row holds: its index and numbers."""
        own = {semconv.INDEX: self.index[row]} if self.index[row] >= 0 else {}
        for key, values in self.attributes.items():
            if row in values:
                own[key] = values[row]
        return own

    def rows_of(self, kind: int) -> list[int]:
        """The rows of ``kind`` (:data:`STEP` or :data:`BATCH`) in start order."""
        found = [row for row in range(len(self.ids)) if self.kind[row] == kind]
        found.sort(key=lambda row: self.start[row])
        return found

    def steps(self) -> list[int]:
        """The rows the findings call steps: the ``step`` rows, else the ``batch`` rows."""
        return self.rows_of(STEP) or self.rows_of(BATCH)

    def part_times(self, row: int) -> dict[str, int]:
        """Nanoseconds of the step in each part and in ``other``, as ``Timeline.parts``."""
        found = {part: self.parts[part][row] for part in PARTS}
        ns = self.attributes.get(semconv.DATA_LOAD_NS, {}).get(row)
        if isinstance(ns, int) and not isinstance(ns, bool) and not found[semconv.DATA_LOAD]:
            found[semconv.DATA_LOAD] += ns
        found["other"] = max(self.wall[row] - sum(found[part] for part in PARTS), 0)
        return found


_UNSET, _OK = Status(StatusCode.UNSET), Status(StatusCode.OK)


class Marks:
    """The values of one mark, a row each: rows and times as arrays, values as given."""

    __slots__ = ("rows", "values", "times")

    def __init__(self) -> None:
        self.rows, self.times = array("q"), array("q")
        self.values: list[Any] = []

    def extend(self, rows: Iterable[int], values: list[Any], times: list[int]) -> None:
        """Append marks, their values as the index writes them (non-finite ones as text)."""
        self.rows.extend(rows)
        self.values.extend(map(_number, values))
        self.times.extend(times)

    def __iter__(self) -> Iterator[tuple[int, Any, int]]:
        return zip(self.rows, self.values, self.times, strict=True)

    def __len__(self) -> int:
        return len(self.rows)


class RowEvent:
    """A mark of a step, from its row: what the findings read of a span event."""

    __slots__ = ("name", "value", "timestamp")

    def __init__(self, name: str, value: Any, timestamp: int) -> None:
        self.name, self.value, self.timestamp = name, value, timestamp

    @property
    def attributes(self) -> dict[str, Any]:
        return {semconv.MARK_VALUE: self.value}  # made when asked: a million steps hold none


class RowSpan:
    """A step span stood in for by its row: the fields of an SDK ``ReadableSpan`` that the
    findings, the charts and the ranks read, and nothing else (no links, no scope)."""

    # What it holds; the rest is read from its row when asked: a million steps hold only this.
    __slots__ = ("name", "context", "parent", "table", "row", "resource")
    links: tuple[Any, ...] = ()
    kind = SpanKind.INTERNAL
    stands_in = True  # for its step span and the parts below it (none of which is read)

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        table: StepTable,
        row: int,
        resource: Any,
    ) -> None:
        self.name, self.context, self.parent = name, context, parent
        self.table, self.row, self.resource = table, row, resource

    @property
    def start_time(self) -> int:
        return self.table.start[self.row]  # type: ignore[no-any-return]

    @property
    def end_time(self) -> int:
        return self.table.start[self.row] + self.table.wall[self.row]  # type: ignore[no-any-return]

    @property
    def wall_ns(self) -> int:
        """Its duration, as the row holds it (what ``Step.wall_ns`` reads)."""
        return self.table.wall[self.row]  # type: ignore[no-any-return]

    @property
    def attributes(self) -> dict[str, Any]:
        return self.table.attributes_of(self.row)

    @property
    def events(self) -> tuple[RowEvent, ...]:
        return self.table.events_of(self.row)

    @property
    def status(self) -> Status:
        return _OK if self.table.status[self.row] == 1 else _UNSET

    def get_span_context(self) -> SpanContext:
        return self.context


def _number(value: Any) -> Any:
    return _NUMBERS.get(value, value) if isinstance(value, str) else value


def step_tables(
    path: str,
    on_problem: Callable[[spool_reader.Problem], None] | None = None,
    *,
    indexed_only: bool = False,
) -> list[StepTable]:
    """Every process's step table of the spool at ``path`` (a cirron directory, its spool
    folder or one file): from the index where it covers the process, else from its spans
    (``indexed_only``: only the processes the index covers, no span read)."""
    names = spool_reader.spool_files(path)
    directory = spool_reader.cirron_directory(path)
    indexed = {} if os.path.isfile(path) else spool_index.read_index(directory)
    rows = {} if os.path.isfile(path) else _read_rows(directory)
    by_process: dict[tuple[Any, ...], list[str]] = {}
    resources: dict[tuple[Any, ...], dict[str, Any]] = {}
    unindexed: list[str] = []
    for name in names:
        lines = indexed.get(os.path.basename(name))
        held = rows.get(os.path.basename(name), [])
        said = sum(line["steps"] + line["batches"] for line in lines or ())
        if lines is None or sum(len(found["rows"]["id"]) for found in held) != said:
            unindexed.append(name)  # no line, or rows lost: read from its spans
            continue
        for line in lines:
            key = process_key_of(line["resource"])
            by_process.setdefault(key, []).append(name)
            resources.setdefault(key, line["resource"])
    tables: dict[tuple[Any, ...], StepTable] = {}
    # A process with a file the index lacks is folded from its spans, every file of it.
    if indexed_only:
        for key in tainted(unindexed, resources):
            by_process.pop(key, None)
        unindexed = []
    from_spans = _fold_spans(unindexed, by_process, on_problem)
    for key, table in from_spans.items():
        tables[key] = table
    for key, files in by_process.items():
        if key in tables:
            continue
        table = _table(resources[key])
        for name in files:
            for found in rows.get(os.path.basename(name), ()):
                if process_key_of(found["resource"]) == key:
                    table.add(found)
        tables[key] = table
    return sorted(tables.values(), key=lambda t: (t.rank is None, t.rank or 0, t.label))


def tainted(
    unindexed: list[str], resources: dict[tuple[Any, ...], dict[str, Any]]
) -> set[tuple[Any, ...]]:
    """The processes that may have spans in the files ``unindexed`` without reading them:
    those of the pid each file is named by (``<pid>-<sequence>``, the writer's)."""
    pids = set()
    for name in unindexed:
        match = spool_reader.SPOOL_NAME.fullmatch(os.path.basename(name))
        pids.add(int(match[1]) if match else None)
    if None in pids:  # a file named otherwise: any process
        return set(resources)
    return {key for key, r in resources.items() if r.get(semconv.PROCESS_PID) in pids}


def _table(resource: dict[str, Any]) -> StepTable:
    label, rank = label_of(resource)
    return StepTable(label, rank, resource, process_key_of(resource))


def _fold_spans(
    unindexed: list[str],
    by_process: dict[tuple[Any, ...], list[str]],
    on_problem: Callable[[spool_reader.Problem], None] | None,
) -> dict[tuple[Any, ...], StepTable]:
    """The tables of the processes that have a file the index lacks, from their spans."""
    if not unindexed:
        return {}
    pending = list(unindexed)
    touched: set[tuple[Any, ...]] = set()
    spans_by: dict[tuple[Any, ...], list[Any]] = {}
    for read in spool_reader.read_files(pending):
        if read.problem is not None and on_problem is not None:
            on_problem(read.problem)
        for span in read.spans:
            key = process_key_of(span.resource.attributes)
            touched.add(key)
            spans_by.setdefault(key, []).append(span)
    # The indexed files of those processes too: a fold needs every span of the process.
    more = sorted({name for key in touched for name in by_process.get(key, ())})
    for read in spool_reader.read_files(more):
        for span in read.spans:
            key = process_key_of(span.resource.attributes)
            if key in touched:
                spans_by.setdefault(key, []).append(span)
    tables = {}
    for key, spans in spans_by.items():
        resource = dict(spans[0].resource.attributes)
        table = _table({k: list(v) if isinstance(v, tuple) else v for k, v in resource.items()})
        found = StepFold().rows(spans)
        if found is not None:
            table.add(json.loads(json.dumps(found)))  # as the index would hold them
        tables[key] = table
    return tables


def _read_rows(directory: str) -> dict[str, list[dict[str, Any]]]:
    """The step rows under ``directory``'s index, by spool file name."""
    found: dict[str, list[dict[str, Any]]] = {}
    for rows in _members(os.path.join(directory, spool_index.FOLDER)):
        found.setdefault(rows["file"], []).append(rows)
    return found


def _members(folder: str) -> Iterator[dict[str, Any]]:
    for rows in spool_index.json_lines(folder, spool_index.STEPS_SUFFIX):
        if _well_formed(rows):
            yield rows


_COLUMNS = COLUMNS


def _well_formed(rows: Any) -> bool:
    """Rows as :class:`StepFold` writes them (a damaged or foreign member is passed over)."""
    if not isinstance(rows, dict) or rows.get("v") != spool_index.VERSION:
        return False
    columns = rows.get("rows")
    if not isinstance(rows.get("file"), str) or not isinstance(columns, dict):
        return False
    if not isinstance(rows.get("resource"), dict):
        return False
    if not all(isinstance(columns.get(key), list) for key in _COLUMNS):
        return False
    traces = rows.get("traces", [])
    if not isinstance(traces, list) or not all(
        isinstance(t, list) and len(t) == 2 and isinstance(t[1], str) for t in traces
    ):
        return False
    if len({len(columns[key]) for key in _COLUMNS}) != 1:
        return False
    return isinstance(rows.get("attributes"), dict) and isinstance(rows.get("marks"), dict)
