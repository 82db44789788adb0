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
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..exporters import files
from ..otel import semconv
from ..otel.version import __version__
from .steps import named_parent

TRAINING_TRACK = "training"
NON_FINITE_MARKS = "non-finite marks (not drawn)"
UNFINISHED = "unfinished"


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


@dataclass
class _Process:
    """The spans of one process (one resource), and what the trace calls it."""

    real_pid: int | None
    rank: Any
    resource: Any
    spans: list[Any] = field(default_factory=list)
    pid: int = 0  # the pid in the file: the real one unless another process has it


def chrome_events(spans: Sequence[Any], origin: int | None = None) -> list[dict[str, Any]]:
    """The Chrome Trace Event JSON events of ``spans``: a process per rank, tracks of
    properly nested slices, counters for point marks, instant events for snapshots.

    Times are microseconds since ``origin`` (Unix ns; default: :func:`time_origin`).
    Every value is one strict JSON takes (no NaN, no infinity). Events are in time
    order; at equal times a longer slice (the parent) comes first.
    """
    origin = time_origin(spans) if origin is None else origin
    processes = _processes(spans)
    hosts = {process.resource.attributes.get(semconv.HOST_NAME) for process in processes}
    tids = itertools.count(1)  # unique in the file; 0 is not a thread to some viewers
    events: list[dict[str, Any]] = []
    for order, process in enumerate(processes):
        tracks, slices = _layout(process.spans, tids)
        events += _metadata(process, order, tracks, _label(process, len(hosts) > 1))
        events += _slice_events(process.pid, tracks[0].tid, slices, origin)
        events += _mark_events(process.pid, tracks[0].tid, process.spans, origin)
    # Metadata first; then by time, a longer slice (the parent) before a shorter one.
    events.sort(key=lambda event: (event.get("ts", -math.inf), -event.get("dur", 0.0)))
    return events


def time_origin(spans: Sequence[Any]) -> int:
    """The trace's first moment (Unix ns): the earliest start of a span or time of a mark."""
    return min(
        (min([span.start_time, *(event.timestamp for event in span.events)]) for span in spans),
        default=0,
    )


# -- processes ------------------------------------------------------------------------------
def _processes(spans: Sequence[Any]) -> list[_Process]:
    """Spans grouped by process (host, pid, instance), ranks first; each given a pid of its own."""
    found: dict[tuple[Any, ...], _Process] = {}
    for span in spans:
        attributes = span.resource.attributes
        key = (
            attributes.get(semconv.HOST_NAME),
            attributes.get(semconv.PROCESS_PID),
            attributes.get(semconv.SERVICE_INSTANCE_ID),
        )
        if key not in found:
            found[key] = _Process(_int(key[1]), attributes.get(semconv.RANK), span.resource)
        found[key].spans.append(span)
    processes = sorted(
        found.values(),
        key=lambda p: (not isinstance(p.rank, int), _int(p.rank) or 0, _first_start(p.spans)),
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
    attributes = process.resource.attributes
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
    spans: list[Any], tids: Iterator[int]
) -> tuple[list[_Track], list[tuple[Any, _Track, int, int]]]:
    """The tracks of one process, and each span as (span, its track, start, end) in ns.

    Spans are placed in start order, parents before their children. A span goes on its
    parent's track, right inside the parent, when it lies within the parent and its
    earlier siblings there have ended; else at the top level of the first track of its
    kind that is free, else on a new one. A root's home is the main track.
    """
    last = max((span.end_time or span.start_time) for span in spans)
    ends = {id(span): max(span.end_time or last, span.start_time) for span in spans}
    by_id: dict[int | None, Any] = {span.context.span_id: span for span in spans}
    depths = _depths(spans, by_id)
    tracks = [_Track(next(tids), TRAINING_TRACK)]
    placed: dict[int, _Track] = {}
    slices = []
    for span in sorted(spans, key=lambda s: (s.start_time, -ends[id(s)], depths[id(s)])):
        start, end = span.start_time, ends[id(span)]
        parent = by_id.get(named_parent(span))
        home = tracks[0] if parent is None else placed.get(id(parent))
        kind = f"overlapping {_text(str(span.name))}"
        if span.name == semconv.SNAPSHOT:
            home, kind = None, semconv.SNAPSHOT  # the snapshot thread finishes it
        elif parent is not None and not parent.start_time <= start <= end <= ends[id(parent)]:
            home = None  # outside its parent: not the parent's thread
        key = id(parent) if parent is not None else None
        track = _track_for(tracks, home, key, kind, start, end)
        if track is None:
            track = _Track(next(tids), kind)
            tracks.append(track)
        track.place(end, id(span))
        placed[id(span)] = track
        slices.append((span, track, start, end))
    return tracks, slices


def _track_for(
    tracks: list[_Track], home: _Track | None, parent: int | None, kind: str, start: int, end: int
) -> _Track | None:
    """``home``, right inside ``parent``, if the slice fits there; else the first track of
    its kind it fits on at the top level; else None."""
    if home is not None and home.fits(start, end, parent):
        return home
    return next((t for t in tracks[1:] if t.name == kind and t.fits(start, end, None)), None)


def _depths(spans: list[Any], by_id: dict[int | None, Any]) -> dict[int, int]:
    """Each span's depth in its process's tree (an ancestor sorts before a tie)."""
    depths: dict[int, int] = {}
    for span in spans:
        depth, ancestor = 0, by_id.get(named_parent(span))
        while ancestor is not None and depth < len(spans):  # a cycle ends too
            depth += 1
            ancestor = by_id.get(named_parent(ancestor))
        depths[id(span)] = depth
    return depths


# -- events ---------------------------------------------------------------------------------
def _slice_events(
    pid: int, main_tid: int, slices: list[tuple[Any, _Track, int, int]], origin: int
) -> list[dict[str, Any]]:
    events = []
    for span, track, start, end in slices:
        name = _text(str(span.name))
        arguments = _arguments(span.attributes)
        if not span.end_time:  # never ended: it lasts to its process's end
            arguments[UNFINISHED] = True
        if semconv.INDEX in arguments:
            name += f"[{arguments[semconv.INDEX]}]"
        ts = (start - origin) / 1000
        events.append(
            {"name": name, "cat": _text(str(span.name)), "ph": "X", "ts": ts,
             "dur": (end - start) / 1000, "pid": pid, "tid": track.tid, "args": arguments}
        )  # fmt: skip
        if span.name == semconv.SNAPSHOT:
            events.append(
                {"name": semconv.SNAPSHOT, "ph": "i", "s": "p", "ts": ts, "pid": pid,
                 "tid": main_tid, "args": _arguments(span.attributes)}
            )  # fmt: skip
    return events


def _mark_events(pid: int, main_tid: int, spans: list[Any], origin: int) -> list[dict[str, Any]]:
    """A counter sample per point mark; one instant event counts those that can't be drawn."""
    events: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    first_dropped: int | None = None
    for span in spans:
        for event in span.events:
            value = (event.attributes or {}).get(semconv.MARK_VALUE)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            name = _text(str(event.name))
            if isinstance(value, float) and not math.isfinite(value):
                dropped[name] = dropped.get(name, 0) + 1
                if first_dropped is None or event.timestamp < first_dropped:
                    first_dropped = event.timestamp
                continue
            events.append(
                {"name": name, "ph": "C", "ts": (event.timestamp - origin) / 1000, "pid": pid,
                 "args": {name: value}}
            )  # fmt: skip
    if first_dropped is not None:
        events.append(
            {"name": NON_FINITE_MARKS, "ph": "i", "s": "p", "ts": (first_dropped - origin) / 1000,
             "pid": pid, "tid": main_tid, "args": dropped}
        )  # fmt: skip
    return events


# -- values ---------------------------------------------------------------------------------
def _arguments(attributes: Any) -> dict[str, Any]:
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


def _first_start(spans: list[Any]) -> int:
    return min(span.start_time for span in spans)


# -- the file -------------------------------------------------------------------------------
def write(spans: Sequence[Any], path: str) -> None:
    """Write the trace of ``spans`` to ``path`` as one JSON document, whole or not at all
    (:func:`cirron.exporters.files.write_output`)."""
    origin = time_origin(spans)
    document = {
        "traceEvents": chrome_events(spans, origin),
        "displayTimeUnit": "ms",
        "otherData": {"source": f"cirron {__version__}", "time_origin_unix_ns": origin},
    }
    files.write_output(path, lambda stream: json.dump(document, stream, allow_nan=False))
