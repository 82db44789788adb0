"""The findings about what a process's steps cost the machine: memory that creeps up from
epoch to epoch, on the host or on the device, and a training thread that other work kept off
the CPU (see :mod:`cirron.offline.findings`).

Each step carries the process's resident memory at its end (``process.memory.usage``) and,
on CUDA, the allocator's peak during the step (``cuda.memory.peak_allocated``). Memory
*creeps* when the figure at the end of each epoch (the host's), or the epoch's highest
step peak (the device's), grows from epoch to epoch: most epochs higher than the last, by
at least :data:`CREEP_MIN_BYTES` and :data:`CREEP_MIN_SHARE` of where it began. A run of
fewer than :data:`MIN_EPOCHS` epochs is cut into that many equal runs of steps instead.

The training thread was *competed for* when, over its measured steps, it waited for a CPU
(``cpu_wait_ns``: the kernel's run delay, time it was ready to run while another thread or
process held the CPU) :data:`COMPETED_SHARE` of their wall time or more. A thread that
sleeps, waits for data, for the device, for I/O or for a lock is not running and not ready
to: its CPU share is low but its run delay is not, so none of these is called competition.
Where the kernel gives no run delay (not Linux, or no scheduler statistics), the steps do
not carry it and the finding is not made: a low CPU share alone cannot tell the two apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..otel import semconv
from .finding import WARNING, Finding, ms
from .steps import Step, Timeline, span_id

MIN_EPOCHS = 4  # windows a creep is judged over (epochs, or equal runs of steps)
MIN_STEPS = 20  # steps a run without enough epochs needs to be judged at all
CREEP_MIN_BYTES = 32 << 20  # growth from the first window to the last: at least this ...
CREEP_MIN_SHARE = 0.05  # ... and this share of the first
RISING_SHARE = 0.7  # of the windows after the first, this share or more higher than before
COMPETED_SHARE = 0.3  # the thread waited for a CPU this share of its steps' time or more
MIN_MEASURED = 5  # steps that carry their CPU figures (on a cadence) a verdict needs

HOST_ACTION = (
    "something is kept from step to step: a loss or output stored as a tensor (append "
    "`loss.item()` instead), a cache or a history that only grows; `tracemalloc` or memray "
    "shows what allocates it"
)
COMPETED_ACTION = (
    "the machine, not the model: see what else runs on it (`top -H`, or `ps -eLo "
    "pid,tid,psr,pcpu,comm --sort=-pcpu`), then give the run its cores (stop or move the "
    "other jobs, `taskset`), and keep torch.set_num_threads / OMP_NUM_THREADS and the "
    "DataLoader's num_workers within the cores the run has"
)
DEVICE_ACTION = (
    "tensors stay alive on the device across steps: a loss kept with its graph, outputs "
    "stored for later; `.detach().cpu()` what you keep, and `torch.cuda.memory_summary()` "
    "shows what holds the memory"
)


def memory_creep(who: str, timeline: Timeline) -> list[Finding]:
    findings = []
    host = _windows(timeline, semconv.PROCESS_MEMORY_USAGE, lambda values: values[-1])
    found = _creep(host)
    if found is not None:
        findings.append(_finding(who, "host memory (RSS)", found, HOST_ACTION))
    device = _windows(timeline, semconv.CUDA_MEMORY_PEAK_ALLOCATED, max)
    found = _creep(device)
    if found is not None:
        findings.append(_finding(who, "the device memory's step peak (CUDA)", found, DEVICE_ACTION))
    return findings


Window = tuple[str, int, Step]  # (what it is: "epoch 3", its figure in bytes, its last step)


def _windows(
    timeline: Timeline, attribute: str, figure: Callable[[list[int]], int]
) -> list[Window]:
    """The figure of each epoch (or equal run of steps) from the steps that carry it."""
    steps = [s for s in timeline.steps if _bytes(s, attribute) is not None]
    groups: list[tuple[str, list[Step]]] = []
    for step in steps:
        epoch = step.epoch
        key = f"epoch {(epoch.attributes or {}).get(semconv.INDEX, '?')}" if epoch else ""
        if groups and groups[-1][0] == key:
            groups[-1][1].append(step)
        else:
            groups.append((key, [step]))
    if len(groups) < MIN_EPOCHS or any(not key for key, _ in groups):
        if len(steps) < MIN_STEPS:
            return []
        size = len(steps) / MIN_EPOCHS
        groups = [
            (
                f"steps {steps[int(i * size)].number}-{steps[int((i + 1) * size) - 1].number}",
                steps[int(i * size) : int((i + 1) * size)],
            )
            for i in range(MIN_EPOCHS)
        ]
    return [
        (key, figure([_bytes(s, attribute) or 0 for s in group]), group[-1])
        for key, group in groups
    ]


def _bytes(step: Step, attribute: str) -> int | None:
    value = (step.span.attributes or {}).get(attribute)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _creep(windows: list[Window]) -> dict[str, Any] | None:
    if len(windows) < 2:
        return None
    figures = [figure for _key, figure, _step in windows]
    first, last = figures[0], figures[-1]
    growth = last - first
    rising = sum(b > a for a, b in zip(figures, figures[1:], strict=False))
    if growth < max(CREEP_MIN_BYTES, CREEP_MIN_SHARE * first):
        return None
    if rising < RISING_SHARE * (len(figures) - 1):
        return None
    # Least squares over the windows: the rate the memory grew at.
    n = len(figures)
    mean_x, mean_y = (n - 1) / 2, sum(figures) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(figures)) / sum(
        (x - mean_x) ** 2 for x in range(n)
    )
    return {
        "windows": [key for key, _figure, _step in windows],
        "bytes": figures,
        "rate_bytes": slope,
        "growth_bytes": growth,
        "by_epoch": windows[0][0].startswith("epoch"),
        "span_ids": [span_id(step.span) for _key, _figure, step in windows],
    }


def megabytes(count: float) -> str:
    """Bytes in MB (GB from 1 GB on), three significant digits: ``40 MB``, ``1.23 GB``."""
    size = count / (1 << 20)
    return f"{size / 1024:.3g} GB" if abs(size) >= 1024 else f"{size:.3g} MB"


def _finding(who: str, what: str, found: dict[str, Any], action: str) -> Finding:
    windows, figures = found["windows"], found["bytes"]
    per = "an epoch" if found["by_epoch"] else "a window"
    return Finding(
        WARNING,
        f"{who}{what} crept up {megabytes(found['rate_bytes'])} {per} over "
        f"{len(windows)} {'epochs' if found['by_epoch'] else 'equal runs of steps'}, from "
        f"{megabytes(figures[0])} ({windows[0]}) to {megabytes(figures[-1])} ({windows[-1]}).",
        action,
        "resources",
        {key: found[key] for key in ("windows", "bytes", "rate_bytes", "growth_bytes")},
        found["span_ids"][-1:],
    )


def cpu_competition(who: str, timeline: Timeline) -> list[Finding]:
    """The training thread waited for a CPU others held for much of its steps' time."""
    measured = [
        step
        for step in timeline.steps
        if step.wall_ns
        and _bytes(step, semconv.CPU_NS) is not None
        and _bytes(step, semconv.CPU_WAIT_NS) is not None
    ]
    if len(measured) < MIN_MEASURED:
        return []
    wall = sum(step.wall_ns for step in measured)
    waited = sum(_bytes(step, semconv.CPU_WAIT_NS) or 0 for step in measured)
    if waited < COMPETED_SHARE * wall:
        return []
    ran = sum(_bytes(step, semconv.CPU_NS) or 0 for step in measured)
    median = sorted(step.wall_ns for step in measured)[len(measured) // 2]
    return [
        Finding(
            WARNING,
            f"{who}the training thread ran on the CPU {ran / wall:.0%} of its step time and "
            f"waited {waited / wall:.0%} of it for a CPU: another process or thread competed "
            f"for the CPU ({len(measured)} measured steps of {len(timeline.steps)}, median "
            f"step {ms(median)}).",
            COMPETED_ACTION,
            "cpu",
            {
                "cpu_share": ran / wall,
                "wait_share": waited / wall,
                semconv.CPU_NS: ran,
                semconv.CPU_WAIT_NS: waited,
                "wall_ns": wall,
                "measured_steps": len(measured),
            },
            [span_id(max(measured, key=lambda s: _bytes(s, semconv.CPU_WAIT_NS) or 0).span)],
        )
    ]
