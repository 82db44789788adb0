"""OpenTelemetry metrics of a profiled run, made off the training thread.

- ``from_spans``: the sink that turns ended spans into measurements (marks, step time by
  part, step and epoch counters, each step's CPU time, RSS and CUDA peaks), each recorded
  in the context of its span so that its exemplar links back to it;
- ``waiting``: the few fields of each ended span that sink holds for a batch, as columns;
- ``sampler``: the one thread that samples the process's CPU and memory and the GPUs;
- ``instruments``: the instruments on each meter, and the mark-to-histogram rule;
- ``providers``: the program's ``MeterProvider`` or cirron's own, with its readers;
- ``recorded``: every measurement kept in memory, behind ``ci.metrics()``;
- ``summary``: the ``stdout``/``log`` line per epoch;
- ``session``: all of it for one profiler (:class:`MetricsSession`).

The profiler (the face) makes the session; nothing in ``recording``, ``training``,
``snapshots`` or ``instrumentors`` imports this package: the hot path never records a metric.

May import: :mod:`cirron.otel`, :mod:`cirron.config`, :mod:`cirron.exporters`, and modules of
this package.
"""

from __future__ import annotations

# The session (and OpenTelemetry's metrics SDK with it) is imported by the profiler when
# metrics are on: ``import cirron`` stays without it.
from .recorded import Recorded, render

__all__ = ["Recorded", "render"]
