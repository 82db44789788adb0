"""The index of the spool: a line per spool file, written as the run goes.

``<path>/index/<pid>.jsonl`` holds, for each spool file that process wrote, what a listing
of runs needs without reading a span: the file, the process (its resource), how many spans,
steps, batches and errors it holds, when they start and end, and the sessions among them.
The spool exporter appends a line after each file it writes, on the sink's thread; a line
is one ``write`` (``O_APPEND``), so a process killed while writing leaves at most one line
cut short, which a reader passes over. The index only saves reading: a spool file with no
line (a spool from before the index, a line lost to a crash, a file named on its own) is
read, and summarized the same way (:func:`summarize`).

A line (JSON, keys in this order)::

    {"v": 1, "file": "123-000004.json.gz", "spans": 5003, "steps": 1000, "batches": 0,
     "errors": 0, "start": 1795..., "end": 1795..., "first": [1795..., "<trace id>"],
     "sessions": [{"start": 1795..., "id": "<span id>", "trace": "<trace id>",
                   "frameworks": ["torch"], "failed": false}],
     "names": {"step": 1000, "forward": 1000, ...},
     "resource": {"service.name": "train", "process.pid": 123, ...},
     "plan": {"max_steps": 1000}, "epoch": 3, "frameworks": ["torch", "transformers"]}

While the run goes on, a line also says what the process's open spans say of it (the
spool sink asks for them once a flush, :attr:`IndexWriter.open_spans`), each key only when
known, so ``cirron watch`` can show a time left: ``"plan"``, the run's length from its
newest ``train`` span (``max_steps``, ``max_epochs``, ``epoch_steps``), open or ended in
this file; ``"epoch"``, the index of the newest epoch, open or ended in this file; and
``"frameworks"``, the open session's (the ``sessions`` entry says them once it ends). A line
without them (before they existed, or nothing known yet) reads as before.

A session ``failed`` when it ended in an error (the process ended with it); a line
written before that key existed has none, and its run is read as failed when any of its
spans was. ``first`` is the earliest span's start and trace id (a run with no run id is named by its
session's trace, else that one's). A batch of spans of several resources has a line for each.
"""

from __future__ import annotations

import collections
import json
import logging
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from opentelemetry.trace import StatusCode

from ..otel import semconv
from . import deflate, files
from .step_rows import StepFold

_log = logging.getLogger("cirron")

FOLDER = "index"
VERSION = 1
STEPS_SUFFIX = ".steps.jsonl.gz"  # beside <pid>.jsonl: the rows of its steps (step_rows)
EPOCH_STEPS = "epoch_steps"  # a line's plan: the steps an epoch makes, where known


def summarize(
    name: str, spans: Iterable[Any], open_spans: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """The index lines of the spool file ``name`` holding ``spans`` (SDK spans, as written
    or as read back): one per resource, in the order first seen. ``open_spans``: the
    process's spans not ended yet, oldest first, for what the run says of itself so far."""
    return [
        _line(name, resource, mine, [s for s in open_spans if _same(s._resource, resource)])
        for resource, mine in _by_resource(list(spans)).values()
    ]


def _by_resource(spans: list[Any]) -> dict[int, tuple[Any, list[Any]]]:
    """``spans`` by resource (its id), in the order first seen."""
    try:  # cirron's spans of one tracer (a flush's, as a rule): one resource, asked once
        one = len(set(map(_STATE_OF, spans))) == 1
    except AttributeError:  # an SDK span, or one read back
        one = False
    if one:
        resource = spans[0]._resource
        return {id(resource): (resource, spans)}
    by_resource: dict[int, tuple[Any, list[Any]]] = {}
    for span in spans:
        resource = span._resource  # (SDK spans and cirron's keep it so)
        entry = by_resource.get(id(resource))
        if entry is None:
            entry = by_resource[id(resource)] = (resource, [])
        entry[1].append(span)
    return by_resource


def _same(resource: Any, other: Any) -> bool:
    return resource is other or resource == other


# Fields read of every span, in C (the sink's thread reads them for every span of a run).
_STATE_OF = operator.attrgetter("_state")  # a cirron span's tracer
_NAME_OF = operator.attrgetter("_name")
_STATUS_OF = operator.attrgetter("_status")
_START_OF = operator.attrgetter("_start_time")
_END_OF = operator.attrgetter("_end_time")


def _line(
    name: str, resource: Any, spans: Sequence[Any], open_spans: Sequence[Any]
) -> dict[str, Any]:
    names = dict(collections.Counter(map(_NAME_OF, spans)))  # (in the order first seen)
    start, end, first = _extent(spans)
    newest: dict[str, Any] = {}  # the last train, epoch and session to end in the file
    sessions = []
    if any(run_name in names for run_name in _RUN_NAMES):
        for span in spans:
            if span._name in _RUN_NAMES:
                newest[span._name] = span
            if span._name == semconv.SESSION:
                sessions.append(_session(span))
    line = {
        "v": VERSION,
        "file": name,
        "spans": len(spans),
        "steps": names.get(semconv.STEP, 0),
        "batches": names.get(semconv.BATCH, 0),
        "errors": _errors(spans),
        "start": start,
        "end": end,
        "first": [start, format(first.get_span_context().trace_id, "032x")] if first else None,
        "sessions": sessions,
        "names": names,
        "resource": {key: _plain(value) for key, value in resource.attributes.items()},
    }
    for span in open_spans:  # an open span is newer than the file's (which ended before it)
        if span._name in _RUN_NAMES:
            newest[span._name] = span
    return line | _so_far(newest)


def _extent(spans: Sequence[Any]) -> tuple[Any, Any, Any]:
    """(the earliest start, the latest end, the first span to start at the earliest) of
    ``spans``; a span with no end ends at its start."""
    if not spans:
        return None, None, None
    first = min(spans, key=_START_OF)
    try:
        end = max(map(_END_OF, spans))
    except TypeError:  # some spans with no end, some with one
        end = None
    if end is None:
        end = max(span._start_time if span._end_time is None else span._end_time for span in spans)
    return first._start_time, end, first


def _errors(spans: Sequence[Any]) -> int:
    """The spans whose status is an error: counted by status object (most share one)."""
    statuses = collections.Counter(map(_STATUS_OF, spans))
    return sum(
        count for status, count in statuses.items() if status.status_code is StatusCode.ERROR
    )


def _session(span: Any) -> dict[str, Any]:
    return {
        "start": span._start_time,
        "id": format(span.get_span_context().span_id, "016x"),
        "trace": format(span.get_span_context().trace_id, "032x"),
        "frameworks": [str(f) for f in (span.attributes or {}).get(semconv.FRAMEWORK) or ()],
        "failed": span._status.status_code is StatusCode.ERROR,
    }


_RUN_NAMES = (semconv.TRAIN, semconv.EPOCH, semconv.SESSION)  # (in _so_far's order)
# The run's length, from its `train` span's attributes: the key in the line, the attributes
# that may say it (the first one there and positive wins).
_PLAN = {
    semconv.MAX_STEPS: (semconv.MAX_STEPS,),  # HF, Lightning, trainloop: optimizer steps
    semconv.MAX_EPOCHS: (semconv.MAX_EPOCHS, semconv.EPOCHS),  # Lightning's; Keras's `epochs`
    EPOCH_STEPS: (semconv.STEPS,),  # Keras: the batches an epoch makes
}


def _so_far(newest: dict[str, Any]) -> dict[str, Any]:
    """What the newest ``train``, epoch and session say of the run: its plan, the epoch's
    index and, while the session is open, its frameworks."""
    found: dict[str, Any] = {}
    train, epoch, session = (newest.get(name) for name in _RUN_NAMES)
    if train is not None:
        plan = _plan(train.attributes or {})
        if plan:
            found["plan"] = plan
    index = (epoch.attributes or {}).get(semconv.INDEX) if epoch is not None else None
    if type(index) is int:
        found["epoch"] = index
    if session is not None and session._end_time is None:
        frameworks = (session.attributes or {}).get(semconv.FRAMEWORK)
        if frameworks:
            found["frameworks"] = [str(name) for name in frameworks]
    return found


def _plan(attributes: Any) -> dict[str, int]:
    plan = {}
    for key, names in _PLAN.items():
        for name in names:
            value = attributes.get(name)
            if type(value) is int and value > 0:
                plan[key] = value
                break
    return plan


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class IndexWriter:
    """Appends the lines of one process's spool files to ``<path>/index/<pid>.jsonl``, and
    their steps' rows to ``<pid>.steps.jsonl.gz``."""

    def __init__(self, path: str) -> None:
        self.directory = os.path.join(path, FOLDER)
        self.failed = False  # said once; the spool goes on without its index
        self.errors = 0  # (ci.health()["spool_index_errors"])
        self._steps = StepFold()
        # The process's open spans, oldest first (the profiler hands its store's): what the
        # run says of itself while it goes on. Asked once a flush; None: the ended spans only.
        self.open_spans: Callable[[], Sequence[Any]] | None = None

    def append(self, file: str, spans: Sequence[Any]) -> None:
        if self.failed:
            return
        try:
            base = os.path.basename(file)
            files.make_directory(self.directory)
            rows = self._steps.rows(spans)
            if rows is not None:  # a gzip member a flush: the file is one gzip stream to zcat
                data = (_json({"v": VERSION, "file": base} | rows) + "\n").encode()
                name = os.path.join(self.directory, f"{os.getpid()}{STEPS_SUFFIX}")
                _append(name, deflate.gzip_member(data, level=6))
            # The file's line last: a line says its rows, if any, are all written.
            lines = summarize(base, spans, self._open_spans())
            text = "".join(_json(line) + "\n" for line in lines)
            _append(os.path.join(self.directory, f"{os.getpid()}.jsonl"), text.encode())
        except Exception as error:  # the spans are on disk; only the index is behind
            self.failed = True
            self.errors += 1
            _log.warning(
                "cirron: cannot write the spool's index in %s (%s); the spool is written as "
                "before, and reading it back reads every file",
                self.directory,
                error,
            )

    def _open_spans(self) -> Sequence[Any]:
        """The open spans, or none when there is no source or it failed: a failure is said
        once and counted, and the index goes on without what they say."""
        source = self.open_spans
        if source is None:
            return ()
        try:
            return source()
        except Exception as error:
            self.open_spans = None
            self.errors += 1
            _log.warning(
                "cirron: cannot read the open spans for the spool's index (%s); the index "
                "goes on without the run's plan",
                error,
            )
            return ()


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _append(name: str, data: bytes) -> None:
    """``data`` at the end of the file ``name``, in one ``write``: a reader sees all of it or
    a part cut short, never another writer's bytes inside it."""
    handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, files.FILE_MODE)
    try:
        os.write(handle, data)
    finally:
        os.close(handle)


def read_index(directory: str) -> dict[str, list[dict[str, Any]]]:
    """The index lines under the cirron directory ``directory``, by spool file name; a line
    that does not read (cut short by a crash, damaged) is passed over."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in _lines(os.path.join(directory, FOLDER)):
        found.setdefault(line["file"], []).append(line)
    return found


def _lines(folder: str) -> Iterator[dict[str, Any]]:
    for line in json_lines(folder, ".jsonl"):
        if well_formed(line):
            yield line


def json_lines(folder: str, suffix: str) -> Iterator[Any]:
    """The JSON value of each line of the files named ``*<suffix>`` in ``folder``, file by
    file in name order; a gzip-compressed file is inflated (as far as it is whole), and a
    line that does not read (cut short by a crash, damaged) is passed over."""
    from . import spool_reader  # the reader loads when an index is read, not written

    try:
        names = sorted(entry for entry in os.listdir(folder) if entry.endswith(suffix))
    except OSError:
        return
    for entry in names:
        try:
            with open(os.path.join(folder, entry), "rb") as stream:
                data = stream.read()
        except OSError:
            continue
        if data[:2] == spool_reader.GZIP_MAGIC:
            data, _damage = spool_reader.inflate(data)
        for raw in data.split(b"\n"):
            try:
                yield json.loads(raw)
            except ValueError:
                continue


_FIELDS = {
    "file": str,
    "spans": int,
    "steps": int,
    "batches": int,
    "errors": int,
    "start": int,
    "end": int,
    "sessions": list,
    "resource": dict,
}


def well_formed(line: Any) -> bool:
    """Whether ``line`` (a JSON value) is an index line of this version, every field there
    (``plan``, ``epoch`` and ``frameworks`` are not always: a reader checks them itself)."""
    return (
        isinstance(line, dict)
        and line.get("v") == VERSION
        and all(isinstance(line.get(key), kind) for key, kind in _FIELDS.items())
        and all(isinstance(session, dict) for session in line["sessions"])
    )
