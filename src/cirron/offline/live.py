"""A run followed while it writes: the spool's index read as it grows, for ``cirron watch``.

The spool exporter appends to ``<path>/index/`` after each flush (:mod:`cirron.exporters.
spool_index`): a line per spool file to ``<pid>.jsonl``, and the flush's step rows as one
gzip member to ``<pid>.steps.jsonl.gz``. :class:`IndexFollower` remembers how far it read
each file and reads only what was appended since: whole lines, whole gzip members (a line
or member still being written is read on the next call). Nothing here opens a spool file,
and nothing reaches the training process: a watcher costs the run nothing.

What is kept does not grow with the run: each process's totals, its recent step rows (the
flushes holding the last :data:`WINDOW` steps), the last :data:`HISTORY` values of each
mark, and what its newest line says of the run so far (its plan, epoch and frameworks) with
the steps its epochs made, for the time left. :class:`Followed` is one process, :class:`LiveRun` the processes of one run.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..exporters import metrics_files, spool_index, spool_reader
from ..otel import semconv
from .runs import label_of, process_key, process_key_of
from .step_table import STEP, StepTable
from .step_table import _well_formed as _well_formed_rows  # (the one check of a flush's rows)

WINDOW = 200  # the recent steps the figures are of
HISTORY = 400  # values kept of each mark, for its sparkline
QUIET_S = 10.0  # a process gone and nothing flushed for this long: the run ended


@dataclass
class Followed:
    """One process of a run, as its index says so far."""

    key: tuple[Any, ...]
    resource: dict[str, Any]
    label: str
    rank: int | None
    run_id: str
    start_ns: int = 0
    end_ns: int = 0
    spans: int = 0
    steps: int = 0  # step spans (the optimizer's), else batches below
    batches: int = 0
    errors: int = 0
    ended: bool = False  # its session ended: the process shut cirron down
    frameworks: list[str] = field(default_factory=list)
    flushed_at: float = 0.0  # when it last wrote, as far as known (wall clock, seconds)
    recent: collections.deque[dict[str, Any]] = field(default_factory=collections.deque)
    recent_rows: int = 0
    rows_seen: list[int] = field(default_factory=lambda: [0, 0])  # step rows, batch rows
    marks: dict[str, collections.deque[float]] = field(default_factory=dict)
    plan: dict[str, int] = field(default_factory=dict)  # its length, as its newest line says
    epoch: int | None = None  # the index of its newest epoch, as its newest line says
    # Each kind's (step, batch) rows in the epoch being read: [its id, rows so far], and the
    # most rows a whole epoch had (the steps an epoch makes, where the plan does not say).
    epoch_rows: list[list[Any]] = field(default_factory=lambda: [[None, 0], [None, 0]])
    whole_epoch_rows: list[int] = field(default_factory=lambda: [0, 0])
    last_step_index: int = -1  # the newest step's index: its framework's global step
    last: dict[str, Any] = field(default_factory=dict)  # each numeric attribute's last value
    # Its steps hold collectives: the ranks' figures need the spans (a collective's wait is
    # told from the work by its place in the backward), read from the window's files once.
    needs_spans: bool = False
    _spans: dict[str, list[Any]] = field(default_factory=dict, repr=False)

    @property
    def step_count(self) -> int:
        return self.steps or self.batches

    def add_line(self, line: dict[str, Any]) -> None:
        """A line of the index: a spool file of this process."""
        if not self.run_id:  # a process with no run id is a run of its own (runs.runs_of)
            self.run_id = str((line.get("first") or [0, self.label])[1])
        self.start_ns = min(self.start_ns or line["start"], line["start"])
        self.end_ns = max(self.end_ns, line["end"])
        self.spans += line["spans"]
        self.steps += line["steps"]
        self.batches += line["batches"]
        self.errors += line["errors"]
        if semconv.COLLECTIVE in (line.get("names") or {}):
            self.needs_spans = True
        if isinstance(line.get("plan"), dict):
            self.plan = {k: v for k, v in line["plan"].items() if _is_number(v) and v > 0}
        if type(line.get("epoch")) is int:
            self.epoch = line["epoch"]
        for name in line.get("frameworks") or ():  # the open session's, while it runs
            if isinstance(name, str) and name not in self.frameworks:
                self.frameworks.append(name)
        for session in line["sessions"]:
            self.ended = True
            for name in session.get("frameworks") or ():
                if name not in self.frameworks:
                    self.frameworks.append(name)
        self.flushed_at = max(self.flushed_at, line["end"] / 1e9)

    def add_rows(self, rows: dict[str, Any]) -> None:
        """A flush's step rows: kept while they hold the last :data:`WINDOW` steps."""
        count = len(rows["rows"]["id"])
        for kind, parent in zip(rows["rows"]["kind"], rows["rows"]["parent"], strict=False):
            if kind in (0, 1):
                self.rows_seen[kind] += 1
                self._count_epoch(kind, parent)
        self.recent.append(rows)
        self.recent_rows += count
        while len(self.recent) > 1 and self.recent_rows - len(self.recent[0]["rows"]["id"]) >= (
            WINDOW
        ):
            self.recent_rows -= len(self.recent.popleft()["rows"]["id"])
        table = StepTable(self.label, self.rank, self.resource)
        table.add(rows)
        for name, marks in table.marks.items():
            held = self.marks.setdefault(name, collections.deque(maxlen=HISTORY))
            held.extend(value for _row, value, _time in marks if _is_number(value))
        for key, values in table.attributes.items():
            if values:
                self.last[key] = values[max(values)]
        for row in range(len(table.index)):
            if table.kind[row] == STEP and table.index[row] > self.last_step_index:
                self.last_step_index = table.index[row]

    def _count_epoch(self, kind: int, parent: Any) -> None:
        """A row of ``kind`` whose parent (its epoch, where there are epochs) is ``parent``:
        a new parent ends the epoch before it, whose rows are its steps."""
        held = self.epoch_rows[kind]
        if held[0] != parent:
            if held[0] is not None:
                self.whole_epoch_rows[kind] = max(self.whole_epoch_rows[kind], held[1])
            held[0], held[1] = parent, 0
        held[1] += 1

    @property
    def epoch_steps(self) -> int | None:
        """The steps an epoch makes: as the plan says (Keras), else the most a whole epoch
        of this process had; None before one ended."""
        if self.plan.get(spool_index.EPOCH_STEPS):
            return self.plan[spool_index.EPOCH_STEPS]
        return self.whole_epoch_rows[0 if self.steps else 1] or None

    def window(self) -> StepTable:
        """The recent steps' rows, as a table (built anew: a few flushes' worth)."""
        table = StepTable(self.label, self.rank, self.resource, self.key)
        for rows in self.recent:
            table.add(rows)
        return table

    def window_spans(self, folder: str) -> list[Any]:
        """The spans of this process in the spool files of the recent steps, each file read
        once while its steps are in the window."""
        files = [rows["file"] for rows in self.recent]
        for name in list(self._spans):
            if name not in files:
                del self._spans[name]
        found: list[Any] = []
        for name in dict.fromkeys(files):
            if name not in self._spans:
                read = spool_reader.read_file(os.path.join(folder, name))
                self._spans[name] = [
                    span for span in read.spans if process_key(span.resource) == self.key
                ]
            found += self._spans[name]
        return found

    def first_number(self, table: StepTable) -> int:
        """The run's number (0, 1, ... of this process) of the first of ``table``'s steps."""
        steps = table.steps()
        kind = table.kind[steps[0]] if steps else 0
        return self.rows_seen[kind] - len(steps)

    def alive(self) -> bool | None:
        """Whether the process still runs: None where that can't be told (another host)."""
        if self.resource.get(semconv.HOST_NAME) != socket.gethostname():
            return None
        pid = self.resource.get(semconv.PROCESS_PID)
        if not isinstance(pid, int):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # another user's process: it exists
            return True
        return True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class LiveRun:
    """The processes of one run, ranks first."""

    id: str
    processes: list[Followed] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        return min(p.start_ns for p in self.processes)

    @property
    def end_ns(self) -> int:
        return max(p.end_ns for p in self.processes)

    @property
    def steps(self) -> int:
        return sum(p.step_count for p in self.processes)

    @property
    def frameworks(self) -> list[str]:
        found: list[str] = []
        for process in self.processes:
            found += [name for name in process.frameworks if name not in found]
        return found

    @property
    def failed(self) -> bool:
        return any(p.errors for p in self.processes)

    def ended(self, now: float) -> str | None:
        """Why the run is over, or None while it runs: every process ended its session, or
        is gone (this host's) with nothing flushed for :data:`QUIET_S`."""
        if all(p.ended for p in self.processes):
            return "failed" if self.failed else "ended"
        if all(
            p.ended or (p.alive() is False and now - p.flushed_at >= QUIET_S)
            for p in self.processes
        ):
            return "crashed: its process ended without closing the run"
        return None


class IndexFollower:
    """Reads what was appended to a cirron directory's index since the last :meth:`poll`."""

    def __init__(self, directory: str) -> None:
        self.folder = os.path.join(directory, spool_index.FOLDER)
        self.directory = directory
        self.offsets: dict[str, int] = {}
        self.processes: dict[tuple[Any, ...], Followed] = {}
        self.metrics = MetricsFollower(directory)

    @property
    def spool_folder(self) -> str:
        """Where the spool files are (asked each time: the run may not have made it yet)."""
        return spool_reader.spool_folder(self.directory)

    def poll(self) -> bool:
        """Read what is new; True when something was."""
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return False
        new = False
        for name in names:
            if name.endswith(spool_index.STEPS_SUFFIX):
                for rows in self._members(name):
                    if _well_formed_rows(rows):
                        self._process(rows["resource"]).add_rows(rows)
                        new = True
            elif name.endswith(".jsonl"):
                for line in self._lines(name):
                    if spool_index.well_formed(line):
                        self._process(line["resource"]).add_line(line)
                        new = True
        self.metrics.poll()
        return new

    def _process(self, resource: dict[str, Any]) -> Followed:
        key = process_key_of(resource)
        found = self.processes.get(key)
        if found is None:
            label, rank = label_of(resource)
            run_id = resource.get(semconv.RUN_ID)  # else its first trace's (add_line)
            found = self.processes[key] = Followed(key, resource, label, rank, str(run_id or ""))
        return found

    def _appended(self, name: str) -> bytes:
        path = os.path.join(self.folder, name)
        offset = self.offsets.get(name, 0)
        try:
            with open(path, "rb") as stream:
                if os.fstat(stream.fileno()).st_size < offset:
                    offset = 0  # written anew (a folder cleared and reused)
                stream.seek(offset)
                data = stream.read()
        except OSError:
            return b""
        self.offsets[name] = offset
        return data

    def _lines(self, name: str) -> Iterator[Any]:
        data = self._appended(name)
        whole = data.rfind(b"\n") + 1  # a line still being written: next time
        self.offsets[name] += whole
        for raw in data[:whole].split(b"\n"):
            try:
                yield json.loads(raw)
            except ValueError:
                continue  # a line cut short by a crash: passed over, as every reader does

    def _members(self, name: str) -> Iterator[Any]:
        data = self._appended(name)
        at = 0
        while at < len(data):
            member = zlib.decompressobj(31)
            try:
                text = member.decompress(data[at:])
            except zlib.error:
                # A member cut short by a crash, then another appended: skip to the next.
                following = data.find(b"\x1f\x8b", at + 1)
                if following < 0:
                    break
                at = following
                continue
            if not member.eof:
                break  # still being written
            at = len(data) - len(member.unused_data)
            for raw in text.split(b"\n"):
                try:
                    yield json.loads(raw)
                except ValueError:
                    continue
        self.offsets[name] += at

    def runs(self) -> list[LiveRun]:
        """The runs followed so far, oldest first."""
        found: dict[str, LiveRun] = {}
        for process in self.processes.values():
            if process.start_ns:  # (rows seen before its line: not listed yet)
                found.setdefault(process.run_id, LiveRun(process.run_id)).processes.append(process)
        for run in found.values():
            run.processes.sort(key=lambda p: (p.rank is None, p.rank or 0, p.label))
        return sorted(found.values(), key=lambda run: run.start_ns)


class MetricsFollower:
    """The last value of the system metrics (CPU, GPU utilisation and memory), from the
    metrics files the run writes every few seconds; each file is read once."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.read: set[str] = set()
        # (metric name, pid, hw.id) -> (time, value)
        self.last: dict[tuple[str, Any, Any], tuple[int, float]] = {}

    def poll(self) -> None:
        if not os.path.isdir(os.path.join(self.directory, metrics_files.FOLDER)):
            return
        for name in metrics_files.metrics_files(self.directory):
            if name in self.read:
                continue
            self.read.add(name)
            for point in metrics_files.read_metrics(name):
                if point["name"] not in _SYSTEM or not _is_number(point.get("value")):
                    continue
                pid = point["resource"].get(semconv.PROCESS_PID)
                key = (point["name"], pid, point["attributes"].get(semconv.HW_ID))
                held = self.last.get(key)
                if held is None or held[0] <= point["time_ns"]:
                    self.last[key] = (point["time_ns"], float(point["value"]))

    def of(self, name: str, pids: set[Any]) -> list[float]:
        """The last value of metric ``name`` for each process of ``pids`` (each GPU's)."""
        return [
            value for (metric, pid, _hw), (_t, value) in self.last.items()
            if metric == name and pid in pids
        ]  # fmt: skip


_SYSTEM = frozenset(
    (
        semconv.PROCESS_CPU_UTILIZATION,
        semconv.HW_GPU_UTILIZATION,
        semconv.HW_GPU_MEMORY_USAGE,
        semconv.HW_GPU_MEMORY_LIMIT,
    )
)
