"""Reading a spool for the ``cirron`` commands that answer questions about steps.

``show --diagnose``, ``show --ranks``, ``compare`` and ``report`` need each step's time by
part, not the spans of its parts. Where the spool's index has the step rows of a process
(:mod:`cirron.offline.step_table`), its steps' parts come from them, and the spans that only
make those parts (a ``forward``, ``backward``, ``optimizer_step`` or ``data_load`` directly
under a step, with no event, link or error) are passed over before they are decoded: four
spans of five in a plain torch loop. Every other span is read as before, and a process the
index does not cover is read whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..exporters import spool_index, spool_reader
from ..otel import semconv
from . import step_table
from .runs import Run, process_key, runs_of

# Spans that need their part spans: a collective's place is in the backward it ran in.
_NEEDS_PARTS = (semconv.COLLECTIVE,)


def read_runs(
    path: str,
    on_problem: Callable[[spool_reader.Problem], None],
    progress: Callable[[], None] | None = None,
) -> list[Run]:
    """The runs of the spool at ``path``, their processes with their step rows where the
    index has them; ``progress`` is called after each file."""
    tables = {table.key: table for table in _tables(path)}
    steps_of = {key: set(table.ids) for key, table in tables.items()}
    every_step = set().union(*steps_of.values()) if steps_of else set()
    spans: list[Any] = []
    for name in spool_reader.spool_files(path):
        read = spool_reader.read_file(name, keep=_keep(every_step) if every_step else None)
        if read.problem is not None:
            on_problem(read.problem)
        spans += read.spans
        if progress is not None:
            progress()
    found = runs_of(spans)
    for run in found:
        for process in run.processes:
            process.table = tables.get(process_key(process.spans[0].resource))
    return found


def _tables(path: str) -> list[step_table.StepTable]:
    """The step tables of the processes the index covers whole, and that need no part span
    for anything else."""
    if os.path.isfile(path):
        return []
    lines = spool_index.read_index(spool_reader.cirron_directory(path))
    needs_parts = {
        step_table.process_key_of(line["resource"])
        for found in lines.values()
        for line in found
        if any(name in _NEEDS_PARTS for name in line.get("names") or {}) or "names" not in line
    }
    tables = step_table.step_tables(path, indexed_only=True)
    return [table for table in tables if table.key not in needs_parts]


def _keep(steps: set[str]) -> Callable[[dict[str, Any]], bool]:
    """Whether to decode a span (an OTLP/JSON dict): not when it only makes a part of a step
    whose row is read."""
    parts = frozenset(semconv.STEP_PARTS)

    def keep(span: dict[str, Any]) -> bool:
        return not (
            span.get("name") in parts
            and span.get("parentSpanId") in steps
            and not span.get("events")
            and not span.get("links")
            and not span.get("status")
        )

    return keep
