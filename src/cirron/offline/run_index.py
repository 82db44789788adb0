"""The runs of a spool as its index lists them: ``cirron runs`` without reading a span.

Each spool file has a line in the index (:mod:`cirron.exporters.spool_index`) saying what it
holds; a file without one (an older spool, a line lost to a crash) is read and summarized the
same way. The lines group into processes and runs exactly as :func:`cirron.offline.runs.runs_of`
groups spans, so a listing says what reading every span would.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..exporters import spool_index, spool_reader
from ..otel import semconv
from .runs import label_of, process_key_of


@dataclass
class ProcessListing:
    label: str
    rank: int | None
    lines: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunListing:
    """What ``cirron runs`` says of one run: the :class:`cirron.offline.runs.Run` figures."""

    id: str
    processes: list[ProcessListing] = field(default_factory=list)

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [line for process in self.processes for line in process.lines]

    @property
    def start_ns(self) -> int:
        return min(line["start"] for line in self.lines)

    @property
    def end_ns(self) -> int:
        return max(line["end"] for line in self.lines)

    @property
    def frameworks(self) -> list[str]:
        found: list[str] = []
        for line in self.lines:
            for session in line["sessions"]:
                for name in session.get("frameworks") or ():
                    if name not in found:
                        found.append(name)
        return found

    @property
    def failed(self) -> bool:
        """As :attr:`cirron.offline.runs.Run.failed`: a session ended in an error (lines
        without the sessions' ``failed``, from an older index, or with no session: any
        error)."""
        sessions = [session for line in self.lines for session in line["sessions"]]
        if sessions and all("failed" in session for session in sessions):
            return any(session["failed"] for session in sessions)
        return any(line["errors"] for line in self.lines)

    @property
    def steps(self) -> int:
        return sum(line["steps"] for line in self.lines) or sum(
            line["batches"] for line in self.lines
        )

    @property
    def spans(self) -> int:
        return sum(line["spans"] for line in self.lines)


def listed_runs(
    path: str, on_problem: Callable[[spool_reader.Problem], None] | None = None
) -> list[RunListing]:
    """The runs of the spool at ``path``, oldest first. Files the index has no line for are
    read (each problem handed to ``on_problem``)."""
    names = spool_reader.spool_files(path)
    indexed = (
        {} if os.path.isfile(path) else spool_index.read_index(spool_reader.cirron_directory(path))
    )
    lines: list[dict[str, Any]] = []
    for name in names:
        found = indexed.get(os.path.basename(name))
        if found is None:
            read = spool_reader.read_file(name)
            if read.problem is not None and on_problem is not None:
                on_problem(read.problem)
            found = spool_index.summarize(os.path.basename(name), read.spans)
        lines += found
    return runs_of_lines(lines)


def runs_of_lines(lines: list[dict[str, Any]]) -> list[RunListing]:
    """The runs of index ``lines``, grouped as :func:`cirron.offline.runs.runs_of` groups
    their spans."""
    by_process: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for line in lines:
        by_process.setdefault(process_key_of(line["resource"]), []).append(line)
    runs: dict[str, RunListing] = {}
    for mine in by_process.values():
        attributes = mine[0]["resource"]
        run_id = attributes.get(semconv.RUN_ID) or _trace_of(mine)
        run = runs.setdefault(str(run_id), RunListing(str(run_id)))
        label, rank = label_of(attributes)
        run.processes.append(ProcessListing(label, rank, mine))
    for run in runs.values():
        run.processes.sort(key=lambda p: (p.rank is None, p.rank or 0, p.label))
    return sorted(runs.values(), key=lambda run: run.start_ns)


def _trace_of(lines: list[dict[str, Any]]) -> str:
    """A process's run when it has no run id: its first session's trace, else its first
    span's."""
    sessions = [session for line in lines for session in line["sessions"]]
    if sessions:
        return str(min(sessions, key=lambda session: session["start"])["trace"])
    firsts = [line["first"] for line in lines if line.get("first")]
    return str(min(firsts)[1]) if firsts else "?"
