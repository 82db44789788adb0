"""What ``cirron watch`` shows of a run, worked out from what :mod:`cirron.offline.live` read.

The step figures are of the recent window (the last :data:`cirron.offline.live.WINDOW` steps
of each process): the median and 95th percentile of the step's wall time, the time in each
part (``data_load``, ``forward``, ``backward``, ``optimizer_step``, ``other``) counted as
the report counts it (:meth:`cirron.offline.step_table.StepTable.part_times`), and the
input-bound share: the wait for data over the steps' wall time, as the ``input`` finding
says it. The findings are those of ``cirron show --diagnose`` (:func:`cirron.offline.
findings.diagnose`), run on the window's rows, and one of its own: a stall, no step for
:data:`STALL_TIMES` times the median step.

The time left, where the run's length is known (its index lines' ``plan``: HF's, trainloop's
or Lightning's ``max_steps``, Lightning's ``max_epochs``, Keras's ``epochs``): the steps left
over the recent steps a second. The steps of a run planned in epochs are its epochs times
the steps an epoch makes (Keras says it; else the most a whole epoch made so far, so a run
planned in epochs has a time left from the end of its first epoch on). The steps done are
the newest step's index (its framework's global step: a run resumed from a checkpoint counts
the checkpoint's) where the plan is in steps, else those this run's process recorded.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource

from ..exporters.lines import format_duration
from ..otel import semconv
from . import findings
from .finding import WARNING, Finding
from .live import Followed, IndexFollower, LiveRun, MetricsFollower
from .runs import Process, Run
from .step_table import PARTS, STEP, StepTable
from .steps import OTHER, span_id

SHOWN_PARTS = (*PARTS, OTHER)
STALL_TIMES = 10  # no step for this many median steps (and at least STALL_MIN_S): a stall
STALL_MIN_S = 5.0


@dataclass
class Rank:
    label: str
    steps: int
    median_ns: int
    parts_ns: dict[str, int]  # each part's median over the window


@dataclass
class Figures:
    """The figures of one run at one moment."""

    id: str
    frameworks: list[str]
    processes: list[str]
    elapsed_ns: int
    steps: int
    steps_per_s: float | None = None
    window: int = 0  # the recent steps the step figures are of
    median_ns: int | None = None
    p95_ns: int | None = None
    parts_ns: dict[str, int] = field(default_factory=dict)  # mean time a step, by part
    input_share: float | None = None
    marks: dict[str, list[float]] = field(default_factory=dict)  # name -> recent values
    memory: dict[str, float] = field(default_factory=dict)  # label -> bytes
    cpu: float | None = None  # CPU time over wall time
    cpu_of: str = "process"  # whose: the process's (its metric, over all cores), else the steps'
    gpu: list[float] = field(default_factory=list)  # each GPU's utilisation, 0..1
    ranks: list[Rank] = field(default_factory=list)
    slowest: str | None = None  # the slowest rank's label, with the part it is slow in
    findings: list[Finding] = field(default_factory=list)
    ended: str | None = None  # why the run is over, or None
    # Its length, where known (:func:`_progress`): the steps done of how many, the epoch
    # (counted from 1) of how many, and the time left at the recent pace.
    done: int = 0
    total_steps: int | None = None
    max_steps: int | None = None  # (the plan said steps: show them, else the epochs)
    epoch: int | None = None
    max_epochs: int | None = None
    left_ns: int | None = None


def _percentile(ordered: list[int], share: float) -> int:
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def figures(run: LiveRun, follower: IndexFollower, now_ns: int, ended: str | None) -> Figures:
    """The figures of ``run`` (``now_ns``: the wall clock, for the elapsed time and a stall)."""
    metrics, spool_folder = follower.metrics, follower.spool_folder
    end = run.end_ns if ended else max(now_ns, run.end_ns)
    found = Figures(
        run.id,
        run.frameworks,
        [p.label for p in run.processes],
        end - run.start_ns,
        run.steps,
        ended=ended,
    )
    tables = [(process, process.window()) for process in run.processes]
    steps_of = _aligned(tables)
    _steps(found, tables, steps_of)
    _resources(found, tables, metrics)
    found.findings = _findings(run, tables, steps_of, found, now_ns, spool_folder)
    found.slowest = _straggler(found.findings)
    _progress(found, run)
    for process in run.processes:
        for name, values in process.marks.items():
            found.marks.setdefault(name, list(values))
    return found


def _steps(
    found: Figures,
    tables: list[tuple[Followed, StepTable]],
    steps_of: dict[tuple[Any, ...], list[int]],
) -> None:
    """The step figures of the window: wall time, parts, input share, pace, each rank's."""
    walls: list[int] = []
    parts = dict.fromkeys(SHOWN_PARTS, 0)
    rates = []
    for process, table in tables:
        rows = steps_of[process.key]
        if not rows:
            continue
        walls += [table.wall[row] for row in rows]
        by_part = [table.part_times(row) for row in rows]
        for times in by_part:
            for part in SHOWN_PARTS:
                parts[part] += times[part]
        first, last = rows[0], rows[-1]
        span = table.start[last] + table.wall[last] - table.start[first]
        if len(rows) > 1 and span > 0:
            rates.append(len(rows) / (span / 1e9))
        found.ranks.append(_rank(process.label, process.step_count, by_part, table, rows))
    if walls:
        ordered = sorted(walls)
        found.window = max(len(rows) for rows in steps_of.values())
        found.median_ns = _percentile(ordered, 0.5)
        found.p95_ns = _percentile(ordered, 0.95)
        found.parts_ns = {part: total // len(walls) for part, total in parts.items()}
        total = sum(walls)
        found.input_share = parts[semconv.DATA_LOAD] / total if total else None
    if rates:
        found.steps_per_s = min(rates)  # the ranks step together: the slowest sets the pace


def _progress(found: Figures, run: LiveRun) -> None:
    """How far the run is along its plan, and the time left at the recent pace; nothing
    where no process knows its plan. Ranks step together: the first one's plan is the run's."""
    process = next((p for p in run.processes if p.plan), None)
    if process is None:
        return
    plan, per_epoch = process.plan, process.epoch_steps
    found.done = process.step_count
    found.max_steps = plan.get(semconv.MAX_STEPS)
    if found.max_steps and process.steps:  # a step's index is its framework's global step
        found.done = max(found.done, process.last_step_index + 1)  # (resumed: not from 0)
    found.max_epochs = plan.get(semconv.MAX_EPOCHS)
    if found.max_epochs and process.epoch is not None:
        found.epoch = min(process.epoch + 1, found.max_epochs)
    bounds = [found.max_steps] if found.max_steps else []
    if found.max_epochs and per_epoch:
        bounds.append(found.max_epochs * per_epoch)
    if not bounds:
        return
    found.total_steps = min(bounds)
    left = found.total_steps - found.done
    if found.steps_per_s and left > 0 and not found.ended:
        found.left_ns = int(left / found.steps_per_s * 1e9)


def _rank(
    label: str, steps: int, by_part: list[dict[str, int]], table: StepTable, rows: list[int]
) -> Rank:
    return Rank(
        label,
        steps,
        int(statistics.median(table.wall[row] for row in rows)),
        {part: int(statistics.median(t[part] for t in by_part)) for part in SHOWN_PARTS},
    )


def _aligned(tables: list[tuple[Followed, StepTable]]) -> dict[tuple[Any, ...], list[int]]:
    """Each process's window steps (rows) that every process with steps has: the ranks are
    compared step for step (:func:`cirron.offline.ranks.align` lines them up by position)."""
    steps = {process.key: table.steps() for process, table in tables}
    firsts = {p.key: p.first_number(table) for p, table in tables if steps[p.key]}
    if len(firsts) < 2:
        return steps
    start = max(firsts.values())
    end = min(firsts[key] + len(steps[key]) for key in firsts)
    return {
        key: rows[max(0, start - firsts[key]) : max(0, end - firsts[key])] if key in firsts else []
        for key, rows in steps.items()
    }


def _straggler(said: list[Finding]) -> str | None:
    """The rank the others wait for, as the ranks' finding names it, and where it is slow."""
    for finding in said:
        if finding.chart == "ranks" and finding.severity == WARNING and "rank" in finding.figures:
            figures = finding.figures
            return (
                f"{figures['rank']} (+{format_duration(int(figures['excess_ns']))} a step in "
                f"{figures['part']})"
            )
    return None


def _resources(
    found: Figures, tables: list[tuple[Followed, StepTable]], metrics: MetricsFollower
) -> None:
    """Memory from the steps' last measures, CPU from the window, GPU from the metrics."""
    several = len(tables) > 1
    cpu, wall = 0, 0
    for process, _table in tables:
        who = f"{process.label} " if several else ""
        rss = process.last.get(semconv.PROCESS_MEMORY_USAGE)
        if isinstance(rss, int | float):
            found.memory[f"{who}host"] = float(rss)
        peak = process.last.get(semconv.CUDA_MEMORY_PEAK_ALLOCATED)
        if isinstance(peak, int | float):
            found.memory[f"{who}device peak"] = float(peak)
    pids = {process.resource.get(semconv.PROCESS_PID) for process, _table in tables}
    utilisation = metrics.of(semconv.PROCESS_CPU_UTILIZATION, pids)
    if utilisation:
        found.cpu = max(utilisation)
    for _process, table in tables:  # else the training thread's, from the steps
        measured = table.attributes.get(semconv.CPU_NS, {})
        for row, value in measured.items():
            if isinstance(value, int | float) and table.wall[row]:
                cpu += int(value)
                wall += table.wall[row]
    if found.cpu is None and wall:
        found.cpu, found.cpu_of = cpu / wall, "training thread"
    found.gpu = metrics.of(semconv.HW_GPU_UTILIZATION, pids)


def _findings(
    run: LiveRun,
    tables: list[tuple[Followed, StepTable]],
    steps_of: dict[tuple[Any, ...], list[int]],
    found: Figures,
    now_ns: int,
    spool_folder: str,
) -> list[Finding]:
    """The findings of ``--diagnose`` on the window's rows, and a stall. Not the ranks'
    uneven step counts: each rank's window ends where its last flush did."""
    processes = []
    spans: list[Any] = []
    for process, table in tables:
        kept = set(steps_of[process.key])
        kinds = {table.kind[row] for row in kept}
        if process.needs_spans:
            ids = {table.ids[row] for row in kept}
            steps = {semconv.STEP if kind == STEP else semconv.BATCH for kind in kinds}
            mine = [
                span
                for span in process.window_spans(spool_folder)
                if span.name not in steps or span_id(span) in ids
            ]
            processes.append(Process(process.label, process.rank, mine))
        else:
            mine = [
                span
                for span in table.row_spans(Resource(table.resource))
                if span.row in kept or table.kind[span.row] not in kinds
            ]
            processes.append(Process(process.label, process.rank, mine, table))
        spans += mine
    said: list[Finding] = []
    if spans:
        window = Run(run.id, spans, processes)
        said = [f for f in findings.diagnose(window) if "step_counts" not in f.figures]
    if found.median_ns and not found.ended:
        idle = (now_ns - run.end_ns) / 1e9
        if idle > max(STALL_MIN_S, STALL_TIMES * found.median_ns / 1e9):
            said.insert(
                0,
                Finding(
                    WARNING,
                    f"No step for {idle:.0f} s ({idle / (found.median_ns / 1e9):.0f}x the median "
                    "step): the run is stalled, or in a long evaluation or checkpoint.",
                    "look at the training's own output, or `py-spy dump --pid PID` for where "
                    "it waits",
                    "stall",
                ),
            )
    return said
