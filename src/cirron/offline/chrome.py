"""The Chrome Trace Event export (``cirron export --format chrome -o trace.json``), which
Perfetto (https://ui.perfetto.dev) and ``chrome://tracing`` open.

Each process of the run is a process of the trace, named ``rank R (pid P)`` (or
``<service.name> (pid P)`` without a rank). Two processes that share a pid (two hosts, a
pid reused by a later run) stay apart: the later one gets a pid of its own in the file,
and its name keeps the real one.

Spans are slices (``ph: X``) on tracks, each track a properly nested stack of slices, as
a thread's are. Spans do not record their thread, so the tracks are laid out from the
span tree: a span goes on its parent's track when it lies within its parent and its
earlier siblings there have ended; one that does not (a scope of another thread, a span that
outlives its parent) opens a track beside it, ``overlapping <name>``, and its children
follow it there. Snapshots, finished on cirron's snapshot thread, have a ``snapshot``
track. The main track is ``training``. A span that never ended (a crash, a kill) lasts
to the end of its process's latest span and says so (``unfinished: true``).

A point mark is a counter track of its own (``ph: C``); a value that is NaN or
infinite can't be drawn, so it is left out, and one instant event per process, at the
first one, counts them by mark. A snapshot is also an instant event (``ph: i``) at its
epoch's boundary, its attributes as arguments. Elsewhere a non-finite number is written
as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``: the file is strict JSON.

Times are microseconds since the trace's first moment, whose Unix time in ns is the
document's ``otherData.time_origin_unix_ns``: from the Unix epoch, a time in
microseconds is too large for a double to keep the nanoseconds a viewer reads back,
and slices nested in the run would overlap in it. The file is written to a temporary
file beside ``trace.json`` and renamed over it: a failed export leaves the previous
file as it was.

**A long run streams.** The spool holds spans as they ended, children before their parent.
A span whose children all lie on its own track, one after another (a step and its
forward, backward, ...; an epoch of such steps), is a *subtree* whose events are written
as soon as it is whole, and back-to-back subtrees under one parent are kept as one; only
the spans that open other tracks (threads, snapshots) are laid out at the end. Event text
beyond 32 MB goes to a scratch file beside the output, so what the export holds does not
grow with the run. Events are in time order on each track, a parent before its children;
the format does not ask for more (a viewer sorts them). The files are parsed in a worker
process (:mod:`cirron.offline.worker`) while the spans of the one before are laid out.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import os
import re
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ..exporters import files, spool_reader
from ..exporters.otlp_json_decoder import decode_span, plain_attributes
from ..otel import semconv
from ..otel.version import __version__
from . import worker
from .steps import named_parent

TRAINING_TRACK = "training"
NON_FINITE_MARKS = "non-finite marks (not drawn)"
UNFINISHED = "unfinished"
# Stand-ins in event text for what the layout decides at the end: the slice's track, and
# the process's main track (a snapshot's instant event). json.dumps writes "\x00" so.
_MAIN_STAND_IN = "\x00M"
_TID = json.dumps("\x00T")
_MAIN = json.dumps(_MAIN_STAND_IN)
_HELD = 32 << 20  # characters of event text held in memory before they go to the scratch file
_READ = 8 << 20  # bytes of the scratch file read at a time
# How long after its end a span may still come in the spool: the processor holds a span
# waiting for its GPU time up to 10 s, then it goes out with a later flush.
_LATE_NS = 15_000_000_000


@dataclass
class _Track:
    """A track: slices placed in start order, kept a properly nested stack, as a thread's."""

    tid: int
    name: str
    open_slices: list[tuple[int, int]] = field(default_factory=list)  # (end, span), outermost first

    def fits(self, start: int, end: int, parent: int | None) -> bool:
        """Whether a slice can go right inside ``parent``'s (None: at the top level) here.

        Its earlier siblings must have ended: as on a thread, a slice's enclosing
        slice is its parent's, never a sibling's that happens to be longer.
        """
        # Slices arrive in start order, so one that ended by ``start`` stays closed; a
        # parent that ends just as its (empty) child begins is still the child's place.
        stack = self.open_slices
        while stack and stack[-1][0] <= start and stack[-1][1] != parent:
            stack.pop()
        if not stack:
            return parent is None
        return stack[-1][1] == parent and end <= stack[-1][0]

    def place(self, end: int, span: int) -> None:
        self.open_slices.append((end, span))


@dataclass(slots=True)
class _Item:
    """What the layout places: a span with the subtree on its track (``whole``), a run of
    such subtrees back to back, or a span alone (its children are items of their own).
    ``pieces``: its event text, each a string or a (offset, length) in the scratch file."""

    start: int
    end: int | None  # None: never ended
    span_id: int
    parent: int | None
    kind: str  # the track it opens when it cannot go on its parent's
    whole: bool
    pieces: list[Any]
    unfinished: tuple[str, str, dict[str, Any]] | None = None  # drawn once the end is known


@dataclass
class _Process:
    """One process (one resource) of the trace, what the trace calls it, and its spans'
    items while they are read."""

    real_pid: int | None
    rank: Any
    attributes: Any
    first_start: int
    pid: int = 0  # the pid in the file: the real one unless another process has it
    spans: int = 0
    last: int = 0  # the latest end (or start) of a span: where a span that never ended ends
    waiting: dict[int | None, list[_Item]] = field(default_factory=dict)  # by parent not yet read
    laid_out: list[_Item] = field(default_factory=list)  # what the layout places at the end
    # The spans read and not yet added, in the order they ended (from ``added`` on)
    ending: list[tuple[float, int, int, _Span]] = field(default_factory=list)
    added: int = 0
    newest: float = 0  # the latest end read
    dropped: dict[str, int] = field(default_factory=dict)  # non-finite marks, by name
    first_dropped: int | None = None


@dataclass(slots=True)
class _Span:
    """The fields of a span the trace shows."""

    span_id: int
    parent: int | None
    name: Any
    start: int
    end: int | None
    attributes: Any
    events: list[tuple[Any, int, Any]]  # (name, time, attributes)


# -- the public entry points ----------------------------------------------------------------
def chrome_events(spans: Sequence[Any], origin: int | None = None) -> list[dict[str, Any]]:
    """The Chrome Trace Event JSON events of ``spans`` (SDK spans): a process per rank,
    tracks of properly nested slices, counters for point marks, instant events for
    snapshots. Times are microseconds since ``origin`` (Unix ns; default:
    :func:`time_origin`). Every value is one strict JSON takes (no NaN, no infinity)."""
    origin = time_origin(spans) if origin is None else origin
    with tempfile.TemporaryFile() as scratch:
        trace = _trace_of(spans, origin, scratch)
        pieces: list[str] = []
        trace.write(pieces.append)
    return json.loads("[" + "".join(pieces).lstrip(",") + "]")  # type: ignore[no-any-return]


def time_origin(spans: Sequence[Any]) -> int:
    """The trace's first moment (Unix ns): the earliest start of a span or time of a mark."""
    return min(
        (min([span.start_time, *(event.timestamp for event in span.events)]) for span in spans),
        default=0,
    )


def write(spans: Sequence[Any], path: str) -> None:
    """Write the trace of ``spans`` (SDK spans) to ``path`` as one JSON document, whole or
    not at all (:func:`cirron.exporters.files.write_output`)."""
    origin = time_origin(spans)

    def fill(stream: IO[str]) -> None:
        with _scratch(path) as scratch:
            _write_document(stream, _trace_of(spans, origin, scratch), origin)

    files.write_output(path, fill)


def write_spool(
    names: Iterable[str],
    processes: Iterable[tuple[Any, int]],
    origin: int,
    path: str,
    on_problem: Callable[[spool_reader.Problem], None],
) -> int:
    """Write the trace of the spool files ``names`` to ``path``, reading one file at a time;
    the number of spans written. ``processes``: (resource attributes, first start) of each
    process to show (the index says them); a span of any other resource is passed over."""
    trace = _Trace(
        [
            _Process(_int(a.get(semconv.PROCESS_PID)), a.get(semconv.RANK), a, s)
            for a, s in processes
        ],
        origin,
    )

    def fill(stream: IO[str]) -> None:
        with _scratch(path) as scratch:
            trace.scratch = scratch
            _read_files(trace, list(names), on_problem)
            trace.ended()
            _write_document(stream, trace, origin)

    files.write_output(path, fill)
    return sum(process.spans for process in trace.processes)


def _scratch(path: str) -> IO[bytes]:
    """A scratch file on the output's disk (a temporary folder may be memory)."""
    folder = os.path.dirname(os.path.realpath(path))
    try:
        return tempfile.TemporaryFile(prefix=".cirron-chrome.", dir=folder)
    except OSError:  # a device, a folder not writable: where temporary files go
        return tempfile.TemporaryFile(prefix="cirron-chrome.")


def _write_document(stream: IO[str], trace: _Trace, origin: int) -> None:
    stream.write('{"traceEvents": [')
    trace.write(stream.write)
    other = {"source": f"cirron {__version__}", "time_origin_unix_ns": origin}
    stream.write(f'\n], "displayTimeUnit": "ms", "otherData": {json.dumps(other)}}}')


# -- reading --------------------------------------------------------------------------------
def _trace_of(spans: Sequence[Any], origin: int, scratch: IO[bytes]) -> _Trace:
    """The trace of SDK ``spans``, read as the spool gives them: as they ended."""
    by_key: dict[tuple[Any, ...], _Process] = {}
    for span in spans:
        attributes = span.resource.attributes
        key = process_key(attributes)
        process = by_key.get(key)
        if process is None:
            process = by_key[key] = _Process(
                _int(key[1]), attributes.get(semconv.RANK), attributes, span.start_time
            )
        process.first_start = min(process.first_start, span.start_time)
    trace = _Trace(list(by_key.values()), origin, scratch)
    for span in _as_ended(spans):
        trace.add(by_key[process_key(span.resource.attributes)], _from_sdk(span))
    return trace


def _as_ended(spans: Sequence[Any]) -> list[Any]:
    """``spans`` in the order they ended (children before a parent that ends with them; one
    that never ended last)."""
    by_id: dict[int | None, Any] = {span.context.span_id: span for span in spans}
    depths = _depths(spans, by_id, named_parent)
    latest = max((span.end_time or span.start_time for span in spans), default=0) + 1
    return sorted(spans, key=lambda s: (s.end_time or latest, -s.start_time, -depths[id(s)]))


def _depths(
    things: Sequence[Any], by_id: dict[Any, Any], parent_of: Callable[[Any], Any]
) -> dict[int, int]:
    """Each one's depth in its tree, by ``id()`` (an ancestor sorts before a tie); a walk up
    a parent cycle ends too."""
    depths: dict[int, int] = {}
    for thing in things:
        depth, ancestor = 0, by_id.get(parent_of(thing))
        while ancestor is not None and depth < len(things):
            depth += 1
            ancestor = by_id.get(parent_of(ancestor))
        depths[id(thing)] = depth
    return depths


def _from_sdk(span: Any) -> _Span:
    events = [(event.name, event.timestamp, event.attributes) for event in span.events]
    return _Span(
        span.context.span_id, named_parent(span), span.name, span.start_time, span.end_time,
        span.attributes, events,
    )  # fmt: skip


# A span line with no attributes, events, links or status, as cirron's encoder writes it
# (most of a long run's: data_load, backward, ...): its fields read without parsing it. What
# the decoder would refuse (a zero span id, a time past 64 bits) does not match.
_BARE_SPAN = re.compile(
    r'\{"traceId":"[0-9a-f]{32}","spanId":"(?!0{16})([0-9a-f]{16})"'
    r'(?:,"parentSpanId":"([0-9a-f]{16})")?,"name":"([^"\\\x00-\x1f]*)","kind":1,'
    r'"startTimeUnixNano":"([0-9]{1,19})","endTimeUnixNano":"([0-9]{1,19})",'
    r'"attributes":\[\](?:,"flags":[0-9]{1,9})?\}'
)


def _read_files(
    trace: _Trace, names: list[str], on_problem: Callable[[spool_reader.Problem], None]
) -> None:
    """Add the spans of the spool files ``names`` that belong to ``trace``'s processes: each
    file parsed in a worker process (:mod:`cirron.offline.worker`) while the spans of the
    one before are laid out here; one cirron did not write is read here, the long way."""
    parse = functools.partial(_parsed, keys=frozenset(trace.by_key))
    with worker.results(parse, names) as parsed:
        for name, found in zip(names, parsed, strict=True):
            if found is None:
                _read_request(trace, name, on_problem)
                continue
            key, columns, skipped = found
            process = trace.by_key.get(key)
            if process is not None:
                _offer_columns(trace, process, columns)
            _say(name, None, skipped, on_problem)


def _parsed(name: str, keys: frozenset[tuple[Any, ...]]) -> _Parsed | None:
    """(the process's key, its spans, what was skipped) of the spool file ``name``, from its
    lines (:func:`cirron.exporters.spool_reader.span_lines`); None for a file cirron did not
    write so. The spans of a process not in ``keys`` are not read."""
    found = spool_reader.span_lines(name)
    if found is None:
        return None
    listed, lines = found
    try:
        attributes = plain_attributes(listed)
    except ValueError:
        return None
    key = process_key(attributes)
    columns = _Columns()
    skipped: list[str] = []
    if key in keys:
        for line in lines:
            columns.add(line, attributes, skipped)
    return key, columns, skipped


class _Columns:
    """A file's spans as columns (numbers as arrays: cheap to hand from the worker); a span
    not laid out as the bare ones (attributes, events) as the fields of a :class:`_Span`."""

    def __init__(self) -> None:
        self.ids, self.parents, self.starts, self.ends = (array("Q") for _ in range(4))
        self.parented = bytearray()
        self.names: list[str] = []
        self.others: dict[int, tuple[Any, ...] | None] = {}  # by position; None: skipped
        self._known: dict[str, str] = {}  # each name one str (pickled once)

    def add(self, line: str, attributes: dict[str, Any], skipped: list[str]) -> None:
        match = _BARE_SPAN.fullmatch(line)
        if match is None:
            record = _record(line, attributes, skipped)
            self.others[len(self.names)] = None if record is None else _fields(record)
            span_id, parent, named, start, end = "0", None, "", "0", "0"
        else:
            span_id, parent, named, start, end = match.groups()
        self.ids.append(int(span_id, 16))
        self.parents.append(int(parent, 16) if parent else 0)
        self.parented.append(1 if parent else 0)
        self.names.append(self._known.setdefault(named, named))
        self.starts.append(int(start))
        self.ends.append(int(end))


_Parsed = tuple[tuple[Any, ...], _Columns, list[str]]  # a file's process, spans, skipped lines


def _offer_columns(trace: _Trace, process: _Process, columns: _Columns) -> None:
    others = columns.others
    spans = zip(
        columns.ids, columns.parents, columns.parented, columns.names, columns.starts,
        columns.ends, strict=True,
    )  # fmt: skip

    def each() -> Iterator[_Span]:
        for position, (span_id, parent, parented, name, start, end) in enumerate(spans):
            if others and position in others:  # (a long run's files have none)
                fields = others[position]
                if fields is not None:
                    yield _Span(*fields)
                continue
            yield _Span(span_id, parent if parented else None, name, start, end or None, None, [])

    trace.offer_many(process, each())


def _record(line: str, attributes: dict[str, Any], skipped: list[str]) -> _Span | None:
    """The span of a line that is not bare, as cirron writes it or as the decoder reads it;
    None (and why in ``skipped``) for one that does not read."""
    try:
        span = json.loads(line)
    except (ValueError, RecursionError) as error:  # (a whole file: never so far)
        skipped.append(f"a line that is not JSON ({error})")
        return None
    try:
        return _from_json(span)
    except Exception:  # not the shape cirron writes: as the decoder reads it
        return _decoded(span, attributes, {}, skipped)


def _fields(span: _Span) -> tuple[Any, ...]:
    """A span's fields, plain (what pickle takes: an SDK span's attributes hold a lock)."""
    attributes = None if span.attributes is None else dict(span.attributes)
    events = [(name, at, None if a is None else dict(a)) for name, at, a in span.events]
    return span.span_id, span.parent, span.name, span.start, span.end, attributes, events


def _read_request(
    trace: _Trace, name: str, on_problem: Callable[[spool_reader.Problem], None]
) -> None:
    document, problem = spool_reader.load_request(name)
    skipped: list[str] = []
    for resource_spans in document["resourceSpans"] if document is not None else ():
        try:
            attributes = plain_attributes(resource_spans["resource"].get("attributes") or [])
            process = trace.by_key.get(process_key(attributes))
            if process is None:
                continue
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    record: _Span | None
                    try:
                        record = _from_json(span)
                    except Exception:  # not the shape cirron writes: as the decoder reads it
                        record = _decoded(span, attributes, scope_spans, skipped)
                    if record is not None:
                        trace.offer(process, record)
        except Exception as error:  # one bad entry costs its own spans, never the export
            skipped.append(f"an entry unreadable ({error!r})")
    _say(name, problem, skipped, on_problem)


def _say(
    name: str,
    problem: spool_reader.Problem | None,
    skipped: list[str],
    on_problem: Callable[[spool_reader.Problem], None],
) -> None:
    """Hand on the file's problem, if any, with the spans skipped in it."""
    if skipped:
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        reason = f"{len(skipped)} spans skipped (the first: {skipped[0]}{more})"
        said = f"{problem.reason}; {reason}" if problem is not None else reason
        problem = spool_reader.Problem(name, said, False)
    if problem is not None:
        on_problem(problem)


def _from_json(span: dict[str, Any]) -> _Span:
    """The fields of an OTLP/JSON span as cirron writes it; anything else raises."""
    span_id = span["spanId"]
    parent = span.get("parentSpanId")
    start = span["startTimeUnixNano"]
    end = span["endTimeUnixNano"]
    name = span["name"]
    if not (
        len(span_id) == 16
        and (parent is None or len(parent) == 16)
        and type(name) is str
        and start.isdigit()
        and end.isdigit()
        and len(span["traceId"]) == 32
        and span.get("kind", 1) == 1
    ):
        raise ValueError("not as cirron writes it")
    listed = span["attributes"]
    attributes = _attributes_of(listed) if listed else {}
    events = [
        (event["name"], int(event["timeUnixNano"]), _attributes_of(event.get("attributes") or []))
        for event in span.get("events") or ()
    ]
    parent_id = int(parent, 16) if parent else None
    if parent_id is None:
        named = attributes.get(semconv.PARENT_SPAN_ID)
        parent_id = int(named, 16) if isinstance(named, str) else None
    return _Span(
        int(span_id, 16), parent_id, name, int(start), int(end) or None, attributes, events
    )


def _attributes_of(listed: list[Any]) -> dict[str, Any]:
    """An OTLP/JSON attribute list as the decoder reads it: numbers and text here, anything
    less plain (or wrong) by the decoder itself."""
    out: dict[str, Any] = {}
    for item in listed:
        key, value = item["key"], item["value"]
        if type(key) is str and key and key not in out and key != semconv.PARENT_SPAN_ID:
            if len(value) != 1:
                break
            content = value.get("intValue")
            if type(content) is str and content.isdigit() and len(content) < 19:
                out[key] = int(content)
                continue
            content = value.get("doubleValue")
            if type(content) is float:
                out[key] = content
                continue
            content = value.get("stringValue")
            if type(content) is str:
                out[key] = content
                continue
        break
    else:
        return out
    return plain_attributes(listed)


def _decoded(
    span: Any, attributes: dict[str, Any], scope_spans: Any, skipped: list[str]
) -> _Span | None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    scope = scope_spans.get("scope") or {}
    try:
        readable = decode_span(
            span,
            Resource(attributes),
            InstrumentationScope(scope.get("name") or "", scope.get("version")),
        )
    except Exception as error:
        skipped.append(str(error))
        return None
    return _from_sdk(readable)


# -- the trace ------------------------------------------------------------------------------
class _Trace:
    """The processes of a trace and their spans' events, as spans are added as they ended."""

    def __init__(
        self, processes: list[_Process], origin: int, scratch: IO[bytes] | None = None
    ) -> None:
        self.processes = _ordered(processes)
        self.by_key = {process_key(process.attributes): process for process in self.processes}
        self.origin = origin
        self.scratch = scratch
        self.read = itertools.count()  # (what orders spans that ended together: as read)
        self.held = 0  # characters of event text in memory
        self.fresh: list[_Item] = []  # the items that may hold some of it
        self.names: dict[str, tuple[str, str, str]] = {}  # see _named

    def offer(self, process: _Process, span: _Span) -> None:
        """Add a span read from the spool: in the order the spans ended, each once every
        span that ended before it (and by :data:`_LATE_NS` may come after it) is read."""
        self.offer_many(process, (span,))

    def offer_many(self, process: _Process, spans: Iterable[_Span]) -> None:
        """:meth:`offer` for a file's spans: they are added once the last is in its place."""
        ending, read, newest, added = process.ending, self.read, process.newest, process.added
        for span in spans:
            end = span.end if span.end is not None else math.inf
            key = (end, -span.start, next(read), span)
            # The spool holds spans about as they ended: most go at the end, in order (cheaper
            # than a heap's push and pop); a late one is put in its place.
            if not ending or ending[-1] < key:
                ending.append(key)
            else:
                bisect.insort(ending, key, lo=added)
            if end > newest:
                newest = end
        process.newest = newest
        self._add_before(process, newest - _LATE_NS)

    def ended(self) -> None:
        """Add the spans still held for one that may come late: none will now."""
        for process in self.processes:
            self._add_before(process, math.inf)
            process.ending, process.added = [], 0

    def _add_before(self, process: _Process, moment: float) -> None:
        """Add the spans held that ended before ``moment`` (all: ``math.inf``)."""
        ending, at = process.ending, process.added
        # (A key is (end, ...): (moment,) sorts before every key that ends at moment or later.)
        cut = len(ending) if moment == math.inf else bisect.bisect_left(ending, (moment,), lo=at)
        add = self.add
        for position in range(at, cut):
            add(process, ending[position][3])
        at = cut
        if at > 4096 and at * 2 > len(ending):  # let go of what was added
            del ending[:at]
            at = 0
        process.added = at

    def add(self, process: _Process, span: _Span) -> None:
        """Add a span whose children (those that ended before it) were added before it."""
        start = span.start
        end = span.end
        if (
            end is not None
            and end >= start
            and not span.attributes
            and not span.events
            and span.span_id not in process.waiting
        ):
            # Most of a long run's spans: a leaf with no attributes or marks (data_load,
            # backward, ...). What the general path below does for one, without its calls.
            process.spans += 1
            if end > process.last:
                process.last = end
            known = self.names.get(span.name) or self._named(span.name)
            if known[2] == semconv.SNAPSHOT:  # (drawn with an instant event too)
                self._add(process, span, start, end)
                return
            category = known[1]
            text = self._slice(process, category, category, "{}", start, end)
            self.held += len(text)
            item = _Item(start, end, span.span_id, span.parent, known[2], True, [text])
            self.fresh.append(item)
            self._place_whole(process, item)
            return
        process.spans += 1
        self._add(process, span, start, end)

    def _add(self, process: _Process, span: _Span, start: int, end: int | None) -> None:
        """:meth:`add`, the general path (``process.spans`` counted already)."""
        if end is not None and end < start:
            end = start
        if (end or start) > process.last:
            process.last = end or start
        shown, category, kind = self._named(span.name)
        arguments = _arguments(span.attributes) if span.attributes else {}
        name = category
        if semconv.INDEX in arguments:
            index = arguments[semconv.INDEX]
            if type(index) is int:  # (what json.dumps would write: digits need no escape)
                name = f'{category[:-1]}[{index}]"'
            else:
                name = json.dumps(f"{shown}[{index}]")
        children = process.waiting.pop(span.span_id, None)
        ordered = sorted(children, key=_start_order) if children else ()
        snapshot = kind == semconv.SNAPSHOT
        whole = end is not None and not snapshot and (not ordered or _nest(ordered, start, end))
        pieces: list[Any] = []
        if end is not None:
            pieces.append(self._slice(process, name, category, _object(arguments), start, end))
            if snapshot:
                pieces.append(self._instant(process, semconv.SNAPSHOT, start, span.attributes))
        if span.events:
            marks = self._marks(process, span.events)
            if marks:
                pieces.append(marks)
        self.held += sum(map(len, pieces))
        item = _Item(start, end, span.span_id, span.parent, kind, whole, pieces)
        if end is None:
            item.unfinished = (name, category, arguments)
        self.fresh.append(item)
        if whole:
            for child in ordered:
                _extend(pieces, child.pieces)
                child.pieces = []
            if len(pieces) > 1 and all(type(piece) is str for piece in pieces):
                item.pieces = ["".join(pieces)]  # (a step and its parts: one text, not six)
            self._place_whole(process, item)
            return
        # Its children are placed on their own, and so is it.
        process.laid_out += [child for child in children or () if child.whole]
        process.laid_out.append(item)
        if span.parent is not None:  # (its parent is not whole either)
            process.waiting.setdefault(span.parent, []).append(item)
        if self.held > _HELD:
            self._spill()

    def _place_whole(self, process: _Process, item: _Item) -> None:
        """A whole subtree waits with its siblings for its parent (see :func:`_wait`)."""
        parent = item.parent
        siblings = process.laid_out if parent is None else process.waiting.setdefault(parent, [])
        if _wait(siblings, item):
            self.fresh.append(siblings[-1])
        if self.held > _HELD:
            self._spill()

    def write(self, out: Callable[[str], object]) -> None:
        """Write every event, the names first, each after a comma and a newline (the
        first without the comma)."""
        tids = itertools.count(1)  # unique in the file; 0 is not a thread to some viewers
        hosts = {process.attributes.get(semconv.HOST_NAME) for process in self.processes}
        laid = [(process, _layout(process, tids)) for process in self.processes]
        first = True
        for order, (process, (tracks, _placed)) in enumerate(laid):
            for event in _metadata(process, order, tracks, _label(process, len(hosts) > 1)):
                out(("\n" if first else ",\n") + json.dumps(event))
                first = False
        for process, (tracks, placed) in laid:
            main = str(tracks[0].tid)
            for item, track in placed:
                tid = str(track.tid)
                if item.unfinished is not None:
                    name, category, arguments = item.unfinished
                    arguments = dict(arguments, **{UNFINISHED: True})
                    end = max(process.last, item.start)
                    item.pieces.insert(
                        0,
                        self._slice(process, name, category, _object(arguments), item.start, end),
                    )
                for text in self._texts(item.pieces):
                    out(text.replace(_TID, tid).replace(_MAIN, main))
            if process.first_dropped is not None:
                dropped = {"name": NON_FINITE_MARKS, "ph": "i", "s": "p",
                           "ts": (process.first_dropped - self.origin) / 1000, "pid": process.pid,
                           "tid": tracks[0].tid, "args": process.dropped}  # fmt: skip
                out(",\n" + json.dumps(dropped))

    # -- event text
    def _named(self, name: Any) -> tuple[str, str, str]:
        """A span's or mark's name as shown, as JSON, and the track a span of it opens."""
        text = str(name)
        known = self.names.get(text)
        if known is None:
            shown = _text(text)
            kind = semconv.SNAPSHOT if name == semconv.SNAPSHOT else f"overlapping {shown}"
            known = self.names[text] = (shown, json.dumps(shown), kind)
        return known

    def _slice(
        self, process: _Process, name: str, category: str, arguments: str, start: int, end: int
    ) -> str:
        """A slice event's text; ``arguments`` as JSON text (:func:`_object`)."""
        return (
            f',\n{{"name": {name}, "cat": {category}, "ph": "X", '
            f'"ts": {(start - self.origin) / 1000!r}, "dur": {(end - start) / 1000!r}, '
            f'"pid": {process.pid}, "tid": {_TID}, "args": {arguments}}}'
        )

    def _instant(self, process: _Process, name: str, at: int, attributes: Any) -> str:
        event = {"name": name, "ph": "i", "s": "p", "ts": (at - self.origin) / 1000,
                 "pid": process.pid, "tid": _MAIN_STAND_IN, "args": _arguments(attributes)}  # fmt: skip
        return ",\n" + json.dumps(event)

    def _marks(self, process: _Process, events: list[tuple[Any, int, Any]]) -> str:
        """A counter sample per point mark; the non-finite ones are counted instead."""
        out = []
        for mark, at, attributes in events:
            value = (attributes or {}).get(semconv.MARK_VALUE)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                name = _text(str(mark))
                process.dropped[name] = process.dropped.get(name, 0) + 1
                if process.first_dropped is None or at < process.first_dropped:
                    process.first_dropped = at
                continue
            named = self._named(mark)[1]
            number = repr(value) if type(value) in (int, float) else json.dumps(value)
            out.append(
                f',\n{{"name": {named}, "ph": "C", "ts": {(at - self.origin) / 1000!r}, '
                f'"pid": {process.pid}, "args": {{{named}: {number}}}}}'
            )
        return "".join(out)

    # -- the scratch file
    def _spill(self) -> None:
        """Move the event text held in memory to the scratch file."""
        if self.scratch is None:
            return
        for item in self.fresh:
            if item.pieces:
                item.pieces = self._spilled(item.pieces)
        self.fresh = []
        self.held = 0

    def _spilled(self, pieces: list[Any]) -> list[Any]:
        assert self.scratch is not None
        out: list[Any] = []
        for is_text, run in itertools.groupby(pieces, key=lambda piece: isinstance(piece, str)):
            if not is_text:
                for piece in run:
                    _extend(out, [piece])
                continue
            data = "".join(run).encode("ascii")
            offset = self.scratch.seek(0, os.SEEK_END)
            self.scratch.write(data)
            _extend(out, [(offset, len(data))])
        return out

    def _texts(self, pieces: list[Any]) -> Iterator[str]:
        for piece in pieces:
            if isinstance(piece, str):
                yield piece
                continue
            assert self.scratch is not None
            offset, length = piece
            self.scratch.seek(offset)
            rest = b""
            while length > 0:
                read = self.scratch.read(min(_READ, length))
                if not read:
                    break
                length -= len(read)
                data = rest + read
                cut = data.rfind(b"\n") if length > 0 else len(data)  # a stand-in is never cut
                if cut <= 0:
                    rest = data
                    continue
                yield data[:cut].decode("ascii")
                rest = data[cut:]
            if rest:
                yield rest.decode("ascii")


def _parent_of(item: _Item) -> int | None:
    return item.parent


def _start_order(item: _Item) -> tuple[int, int]:
    return item.start, -(item.end or 0)


def _nest(children: Sequence[_Item], start: int, end: int) -> bool:
    """Whether ``children`` (in start order) lie on their parent's track inside it, one after
    another (each whole itself): then the parent and they are one subtree."""
    previous = start
    for child in children:
        if not child.whole or child.end is None:
            return False
        if child.start < previous or child.end > end:
            return False
        previous = child.end
    return True


def _wait(items: list[_Item], item: _Item) -> bool:
    """Add the whole subtree ``item`` to its siblings; right after a whole sibling of its
    name it joins it (a stretch of steps is one item, not one each): then True. (A sibling
    of another name, a thread's span begun in a step, ends the stretch: it is placed on its
    own, as is what follows it.)"""
    last = items[-1] if items else None
    if (
        last is not None
        and item.whole
        and last.whole
        and last.end is not None
        and item.end is not None
        and last.end <= item.start
        and last.parent == item.parent
        and last.kind == item.kind
    ):
        last.end = item.end
        _extend(last.pieces, item.pieces)
        item.pieces = []
        return True
    items.append(item)
    return False


def _extend(pieces: list[Any], more: list[Any]) -> None:
    """Append ``more`` to ``pieces``, a piece of the scratch file right after the last one
    joining it (within ``more``, made by this too, such pieces are joined already)."""
    if more and pieces and type(more[0]) is tuple and type(pieces[-1]) is tuple:
        offset, length = pieces[-1]
        if offset + length == more[0][0]:
            pieces[-1] = (offset, length + more[0][1])
            pieces.extend(itertools.islice(more, 1, None))
            return
    pieces.extend(more)


# -- processes ------------------------------------------------------------------------------
def process_key(attributes: Any) -> tuple[Any, ...]:
    """What tells the trace's processes apart, from a resource's attributes."""
    return (
        attributes.get(semconv.HOST_NAME),
        attributes.get(semconv.PROCESS_PID),
        attributes.get(semconv.SERVICE_INSTANCE_ID),
    )


def _ordered(processes: list[_Process]) -> list[_Process]:
    """``processes``, ranks first, each given a pid of its own."""
    processes = sorted(
        processes,
        key=lambda p: (not isinstance(p.rank, int), _int(p.rank) or 0, p.first_start),
    )
    real = {process.real_pid for process in processes if process.real_pid}
    synthetic = (pid for pid in itertools.count(max(real, default=0) + 1) if pid not in real)
    taken: set[int] = set()
    for process in processes:
        wanted = process.real_pid
        process.pid = wanted if wanted and wanted not in taken else next(synthetic)
        taken.add(process.pid)
    return processes


def _label(process: _Process, many_hosts: bool) -> str:
    attributes = process.attributes
    who = (
        f"rank {_text(str(process.rank))}"
        if process.rank is not None
        else _text(str(attributes.get(semconv.SERVICE_NAME, "python")))
    )
    where = [f"pid {process.real_pid}"] if process.real_pid else []
    if many_hosts:
        where.append(f"on {_text(str(attributes.get(semconv.HOST_NAME)))}")
    return f"{who} ({' '.join(where)})" if where else who


def _metadata(
    process: _Process, order: int, tracks: list[_Track], label: str
) -> list[dict[str, Any]]:
    """The names of the process and its tracks, and their order in the viewer."""
    pid = process.pid
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": tracks[0].tid,
         "args": {"name": label}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": tracks[0].tid,
         "args": {"sort_index": order}},
    ]  # fmt: skip
    for position, track in enumerate(tracks):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": track.tid,
             "args": {"name": track.name}}
        )  # fmt: skip
        events.append(
            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": track.tid,
             "args": {"sort_index": position}}
        )  # fmt: skip
    return events


# -- tracks ---------------------------------------------------------------------------------
def _layout(
    process: _Process, tids: Iterator[int]
) -> tuple[list[_Track], list[tuple[_Item, _Track]]]:
    """The tracks of one process, and each of its items on its track, in start order.

    Items are placed in start order, parents before their children. An item goes on its
    parent's track, right inside the parent, when it lies within the parent and its
    earlier siblings there have ended; else at the top level of the first track of its
    kind that is free, else on a new one. A root's home is the main track.
    """
    # (What still waits for a parent that never came, or came before it, goes on its own.)
    items = process.laid_out + [i for items in process.waiting.values() for i in items if i.whole]
    last = process.last
    ends = {id(item): max(item.end or last, item.start) for item in items}
    by_id: dict[int | None, _Item] = {item.span_id: item for item in items}
    depths = _depths(items, by_id, _parent_of)
    tracks = [_Track(next(tids), TRAINING_TRACK)]
    placed: dict[int, _Track] = {}
    out = []
    for item in sorted(items, key=lambda i: (i.start, -ends[id(i)], depths[id(i)])):
        start, end = item.start, ends[id(item)]
        parent = by_id.get(item.parent)
        home = tracks[0] if parent is None else placed.get(id(parent))
        kind = item.kind
        if kind == semconv.SNAPSHOT:
            home = None  # the snapshot thread finishes it
        elif parent is not None and not parent.start <= start <= end <= ends[id(parent)]:
            home = None  # outside its parent: not the parent's thread
        key = id(parent) if parent is not None else None
        track = _track_for(tracks, home, key, kind, start, end)
        if track is None:
            track = _Track(next(tids), kind)
            tracks.append(track)
        track.place(end, id(item))
        placed[id(item)] = track
        out.append((item, track))
    return tracks, out


def _track_for(
    tracks: list[_Track], home: _Track | None, parent: int | None, kind: str, start: int, end: int
) -> _Track | None:
    """``home``, right inside ``parent``, if the slice fits there; else the first track of
    its kind it fits on at the top level; else None."""
    if home is not None and home.fits(start, end, parent):
        return home
    return next((t for t in tracks[1:] if t.name == kind and t.fits(start, end, None)), None)


# -- values ---------------------------------------------------------------------------------
def _object(arguments: dict[str, Any]) -> str:
    """``arguments`` as JSON text (as json.dumps writes it), numbers without its cost."""
    if not arguments:
        return "{}"
    parts = []
    for key, value in arguments.items():
        kind = type(value)
        if kind is not int and kind is not float:  # (finite: see _plain)
            return json.dumps(arguments)
        parts.append(f"{json.dumps(key)}: {value!r}")
    return "{" + ", ".join(parts) + "}"


def _arguments(attributes: Any) -> dict[str, Any]:
    plain = True
    for key, value in (attributes or {}).items():  # most often: names and numbers, as they are
        kind = type(value)
        if (
            type(key) is not str
            or not key.isascii()
            or not (kind is int or (kind is float and math.isfinite(value)))
        ):
            plain = False
            break
    if plain:
        return dict(attributes or {})
    return {_text(str(key)): _plain(value) for key, value in (attributes or {}).items()}


def _plain(value: Any) -> Any:
    """``value`` as strict JSON takes it: non-finite numbers as text, tuples as lists."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return _arguments(value)
    if isinstance(value, bytes):
        return value.hex()
    return _text(str(value))


def _text(text: str) -> str:
    """``text`` without lone surrogates, which no UTF-8 reader takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
