"""The ``stdout`` and ``log`` outputs of metrics: one line per epoch.

``[cirron] metrics epoch[1]: 120 steps, step 12.3ms p50 / 15.1ms p95, loss 0.42, cpu 98%,
rss 812MB``: the steps that ended in the epoch, their wall time's median and 95th
percentile, the last value of each numeric point mark (the first six names), the training
thread's CPU time over the steps' wall time (low: it waited, for a device, data or I/O),
the highest RSS at a step's end and, on CUDA, the highest peak of allocated device memory.
``log`` writes the same text at INFO on the ``cirron.metrics`` logger.
"""

from __future__ import annotations

import collections
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..exporters.console import PREFIX
from ..exporters.lines import format_duration, format_value
from ..otel import semconv
from ..otel.health import printable

metrics_logger = logging.getLogger("cirron.metrics")
MARKS_SHOWN = 6
_KEPT_PER_MARK = 1024  # values of a mark waiting for their epoch's end (a flush or two's worth)


def write_stdout(line: str) -> None:
    stream = sys.stdout
    if stream is not None:
        stream.write(PREFIX + line + "\n")
        stream.flush()


def write_log(line: str) -> None:
    metrics_logger.info("%s%s", PREFIX, line)


def _percentile(ordered: list[int], share: float) -> int:
    """Nearest rank: the smallest value with at least ``share`` of the values at or below it."""
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


def format_bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count}B"


class EpochSummary:
    """What the steps of the open epoch added up to; a line per epoch to each writer."""

    def __init__(self, writers: Sequence[Callable[[str], None]]) -> None:
        self.writers = list(writers)
        # Marks arrive before the epoch they belong to is handled (a batch later): the latest
        # values of each (the first MARKS_SHOWN names) wait with their times, and count in
        # the epoch that ends after them.
        self._pending: dict[str, collections.deque[tuple[int, float | int]]] = {}
        self._reset()

    def _reset(self) -> None:
        self.walls: list[int] = []
        self.cpu_ns = 0
        self.cpu_wall_ns = 0  # wall time of the steps that have a CPU time
        self.rss = 0
        self.cuda_peak = 0
        self.marks: dict[str, Any] = {}  # the last value of each mark by the epoch's end

    def step(self, wall_ns: int, cpu_ns: Any, rss: Any, cuda_peak: Any) -> None:
        self.walls.append(wall_ns)
        if isinstance(cpu_ns, int):
            self.cpu_ns += cpu_ns
            self.cpu_wall_ns += wall_ns
        if isinstance(rss, int):
            self.rss = max(self.rss, rss)
        if isinstance(cuda_peak, int):
            self.cuda_peak = max(self.cuda_peak, cuda_peak)

    def mark(self, name: str, value: float | int, time_ns: int) -> None:
        if not self.writers:
            return
        values = self._pending.get(name)
        if values is None:
            if len(self._pending) >= MARKS_SHOWN:
                return
            values = self._pending[name] = collections.deque(maxlen=_KEPT_PER_MARK)
        values.append((time_ns, value))

    def _marks_until(self, end_ns: int) -> None:
        for name, values in self._pending.items():
            while values and values[0][0] <= end_ns:
                self.marks[name] = values.popleft()[1]

    def line(self, index: Any) -> str:
        where = f"epoch[{format_value(index)}]" if index is not None else semconv.EPOCH
        if not self.walls:
            return f"metrics {where}: no steps"
        ordered = sorted(self.walls)
        parts = [
            f"{len(ordered)} step{'s' if len(ordered) != 1 else ''}",
            f"step {format_duration(_percentile(ordered, 0.5))} p50 / "
            f"{format_duration(_percentile(ordered, 0.95))} p95",
        ]
        parts += [
            f"{printable(name, 40)} {format_value(value)}" for name, value in self.marks.items()
        ]
        if self.cpu_wall_ns:
            parts.append(f"cpu {100 * self.cpu_ns / self.cpu_wall_ns:.0f}%")
        if self.rss:
            parts.append(f"rss {format_bytes(self.rss)}")
        if self.cuda_peak:
            parts.append(f"cuda {format_bytes(self.cuda_peak)} peak")
        return f"metrics {where}: " + ", ".join(parts)

    def epoch_ended(self, index: Any, end_ns: int) -> None:
        """Write the epoch's line (none for an epoch without steps: nothing to sum up)."""
        self._marks_until(end_ns)
        if self.writers and self.walls:
            text = self.line(index)
            for write in self.writers:
                write(text)
        self._reset()
