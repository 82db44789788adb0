"""The runs of a spool: which spans belong to which run, and which process of it.

A *run* is one profiled training: the ``cirron.session`` of each of its processes.
The processes of one run are its ranks: they share a run id (``CIRRON_RUN_ID``, or
``TORCHELASTIC_RUN_ID`` under torchrun), and with it the trace id of their sessions.
A process with no run id is a run of its own. Two runs written to one folder are two
runs, never two ranks; ranks are compared only within their run.

A process is told apart by its resource (``service.instance.id``, else host and pid), so a
rank that restarted under the same run id joins its run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from ..otel import semconv

ALL = "all"


@dataclass
class Process:
    """One process of a run (a rank, or the one process of a single-process run)."""

    label: str  # "rank 0", or "pid 1234" without a rank
    rank: int | None
    spans: list[Any] = field(default_factory=list)
    # Its step rows (cirron.offline.step_table), when they were read: the parts of its steps
    # come from them, and the spans need not hold the steps' forward, backward, ...
    table: Any = None
    passed_over: int = 0  # spans of its steps' parts not read (their rows were)
    _timeline: Any = field(default=None, repr=False, compare=False)

    def timeline(self) -> Any:
        """The process's :class:`cirron.offline.steps.Timeline`, built once."""
        if self._timeline is None:
            from .steps import Timeline

            self._timeline = Timeline(self.spans, self.table)
        return self._timeline


@dataclass
class Run:
    """The spans of one run, its processes, and what a listing says of it."""

    id: str  # the run id, else the session's trace id (hex)
    spans: list[Any] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    # What is worked out once and read by several parts (the ranks' alignment: the findings
    # and the report's heat map), by name.
    worked_out: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def span_count(self) -> int:
        """The spans of the run in the spool, read or not (see ``Process.passed_over``)."""
        return len(self.spans) + sum(process.passed_over for process in self.processes)

    @property
    def start_ns(self) -> int:
        return min(span.start_time for span in self.spans)

    @property
    def end_ns(self) -> int:
        return max((span.end_time or span.start_time) for span in self.spans)

    @property
    def frameworks(self) -> list[str]:
        found: list[str] = []
        for span in self.spans:
            if span.name == semconv.SESSION:
                for name in (span.attributes or {}).get(semconv.FRAMEWORK) or ():
                    if name not in found:
                        found.append(name)
        return found

    @property
    def failed(self) -> bool:
        """The run ended with an error: a session (a process) ended in one, or, with no
        session read, any span did. A run that caught its errors and went on did not fail."""
        sessions = [span for span in self.spans if span.name == semconv.SESSION]
        return any(span.status.status_code.name == "ERROR" for span in (sessions or self.spans))

    @property
    def steps(self) -> int:
        steps = sum(1 for span in self.spans if span.name == semconv.STEP)
        return steps or sum(1 for span in self.spans if span.name == semconv.BATCH)


def process_key(resource: Any) -> tuple[Any, ...]:
    return process_key_of(resource.attributes)


def process_key_of(attributes: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells a process apart, from its resource's attributes."""
    instance = attributes.get(semconv.SERVICE_INSTANCE_ID)
    if instance is not None:
        return ("instance", instance)
    return ("pid", attributes.get(semconv.HOST_NAME), attributes.get(semconv.PROCESS_PID))


def label_of(attributes: Mapping[str, Any]) -> tuple[str, int | None]:
    """A process's label (``rank 0``, else ``pid 1234``) and rank, from its resource's
    attributes."""
    rank = attributes.get(semconv.RANK)
    if isinstance(rank, int) and not isinstance(rank, bool):
        return f"rank {rank}", rank
    return f"pid {attributes.get(semconv.PROCESS_PID, '?')}", None


def runs_of(spans: Sequence[Any]) -> list[Run]:
    """The runs of ``spans``, oldest first, each with its processes (by rank, then pid)."""
    by_process: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for span in spans:
        by_process[process_key(span.resource)].append(span)
    runs: dict[str, Run] = {}
    for mine in by_process.values():
        resource = mine[0].resource
        run_id = resource.attributes.get(semconv.RUN_ID)
        if not run_id:
            sessions = [s for s in mine if s.name == semconv.SESSION]
            first = min(sessions or mine, key=lambda s: s.start_time)
            run_id = format(first.context.trace_id, "032x")
        run = runs.setdefault(str(run_id), Run(str(run_id)))
        run.spans += mine
        label, rank = label_of(resource.attributes)
        run.processes.append(Process(label, rank, mine))
    for run in runs.values():
        run.processes.sort(key=lambda p: (p.rank is None, p.rank or 0, p.label))
    return sorted(runs.values(), key=lambda run: run.start_ns)


class _Named(Protocol):
    id: str


Listed = TypeVar("Listed", bound=_Named)  # a Run, or a run as the index lists it


def pick(runs: list[Listed], choice: str | None) -> list[Listed]:
    """The runs ``--run`` names: None the latest, ``all``, ``N`` (1 is the oldest, -1 the
    latest, as ``cirron runs`` numbers them), or a run id or its first characters (4 digits
    or more that are no run's number name the one run whose id begins with them, if one
    does)."""
    if not runs:
        return []
    if choice is None:
        return [runs[-1]]
    if choice == ALL:
        return runs
    try:
        number = int(choice)
    except ValueError:
        number = None
    known = ", ".join(f"{n} ({run.id[:12]})" for n, run in enumerate(runs, 1))
    if number is not None and str(number) == choice.strip():  # a run's number first
        if 1 <= number <= len(runs):
            return [runs[number - 1]]
        if -len(runs) <= number <= -1:
            return [runs[number]]
        # Else, 4 digits or more, the first characters of one run's id that are all digits
        # ("637083" of "6370833b..."); fewer are a run's number mistyped ("7" of 2 runs).
        matches = [run for run in runs if run.id.startswith(choice)] if len(choice) >= 4 else []
        if len(matches) == 1:
            return matches
        raise LookupError(f"--run {choice!r} names no run; the runs are: {known}, or 'all'")
    matches = [run for run in runs if run.id.startswith(choice)]
    if len(matches) == 1:
        return matches
    if matches:
        raise LookupError(f"--run {choice!r} matches {len(matches)} runs; give more of the id")
    raise LookupError(f"--run {choice!r} names no run; the runs are: {known}, or 'all'")
