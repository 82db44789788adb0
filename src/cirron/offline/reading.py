"""Reading a spool for the ``cirron`` commands that answer questions about steps.

``show --diagnose``, ``show --ranks``, ``compare`` and ``report`` need each step's time by
part, not the spans of its parts. Where the spool's index has the step rows of a process
(:mod:`cirron.offline.step_table`), its steps' parts come from them, and the spans that only
make those parts (a ``forward``, ``backward``, ``optimizer_step`` or ``data_load`` directly
under a step, with no event, link or error) are passed over before they are decoded: four
spans of five in a plain torch loop. A step whose row holds all the findings read of it
(numbers and number marks, no error) is its row (:class:`cirron.offline.step_table.RowSpan`),
its span passed over too. Every other span is read as before, and a process the index does
not cover is read whole.

Where the index has rows, the files are read, inflated and sifted in worker processes
(:mod:`cirron.offline.worker`), a few ahead, while the spans kept of each (its epochs, the
session, what went wrong) are decoded here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.resources import Resource

from ..exporters import spool_index, spool_reader
from ..otel import semconv
from . import step_table, worker
from .runs import Run, process_key, process_key_of, runs_of

# Spans that need their part spans: a collective's place is in the backward it ran in.
_NEEDS_PARTS = (semconv.COLLECTIVE,)
# Where cirron's encoder puts a child span's ids and name in its line (see _Keep.line).
_SPAN_ID, _PARENT_ID, _NAME = '","spanId":"', ',"parentSpanId":"', ',"name":"'


def read_runs(
    path: str,
    on_problem: Callable[[spool_reader.Problem], None],
    progress: Callable[[], None] | None = None,
) -> list[Run]:
    """The runs of the spool at ``path``, their processes with their step rows where the
    index has them; ``progress`` is called after each file."""
    lines = (
        {} if os.path.isfile(path) else spool_index.read_index(spool_reader.cirron_directory(path))
    )
    tables = {table.key: table for table in _tables(path, lines)}
    steps = set().union(*(table.ids for table in tables.values())) if tables else set()
    # The few rows that do not stand for their spans (a million steps: one set, not two).
    partial = set().union(*(table.partial_ids() for table in tables.values())) if tables else set()
    spans: list[Any] = []
    keep = _Keep(steps, partial) if tables else None
    passed_over: dict[tuple[Any, ...], int] = {}
    names = spool_reader.spool_files(path)
    load = keep.load if keep is not None else _whole
    # With rows, little of a file is kept: it is read and sifted in worker processes (two:
    # this one mostly waits for them), beginning now, while the rows are made into steps.
    with worker.results(load, names, use_worker=keep is not None, workers=2) as loaded:
        for table in tables.values():  # the steps their rows stand for
            spans += table.row_spans(Resource(table.resource))
        for name, (request, passed) in zip(names, loaded, strict=True):
            read = spool_reader.decode_file(name, request)
            if read.problem is not None:
                on_problem(read.problem)
            spans += read.spans
            if passed:  # (only a file with a line has rows)
                key = process_key_of(lines[os.path.basename(name)][0]["resource"])
                passed_over[key] = passed_over.get(key, 0) + passed
            if progress is not None:
                progress()
    found = runs_of(spans)
    for run in found:
        for process in run.processes:
            key = process_key(process.spans[0].resource)
            process.table = tables.get(key)
            process.passed_over = passed_over.get(key, 0)
    return found


def _tables(path: str, lines: dict[str, list[dict[str, Any]]]) -> list[step_table.StepTable]:
    """The step tables of the processes the index (``lines``) covers whole, and that need
    no part span for anything else."""
    if not lines:
        return []
    needs_parts = {
        process_key_of(line["resource"])
        for found in lines.values()
        for line in found
        if any(name in _NEEDS_PARTS for name in line.get("names") or {}) or "names" not in line
    }
    tables = step_table.step_tables(path, indexed_only=True)
    return [table for table in tables if table.key not in needs_parts]


def _whole(name: str) -> tuple[spool_reader.Loaded, int]:
    """The spool file ``name`` read (:func:`cirron.exporters.spool_reader.load_file`), no
    span passed over."""
    return spool_reader.load_file(name), 0


class _Keep:
    """Whether to decode a span (an OTLP/JSON dict): not when its row stands for it, nor
    when it only makes a part of a step whose row is read (counted in ``passed_over``)."""

    def __init__(self, steps: set[str], partial: set[str]) -> None:
        self.steps, self.partial = steps, partial
        self.parts = frozenset(semconv.STEP_PARTS)
        self.rows = frozenset((semconv.STEP, semconv.BATCH))
        self.passed_over = 0

    def load(self, name: str) -> tuple[spool_reader.Loaded, int]:
        """The spool file ``name`` read, less what it passes over, and how many spans that
        made a step's part it passed over."""
        self.passed_over = 0
        return spool_reader.load_file(name, keep=self), self.passed_over

    def line(self, line: str) -> bool:
        """The same, asked of a span's line before it is parsed."""
        # Most lines are a child's, laid out as spool_reader.span_line_ids reads them: its ids
        # and name read here at once (a million steps are five million lines, each asked).
        if line.startswith(_SPAN_ID, 44) and line.startswith(_PARENT_ID, 73):
            end = line.find('"', 116)
            if line.startswith(_NAME, 107) and end > 0 and line[end - 1] != "\\":
                return self._keep(line[116:end], line[56:72], line[90:106], _plain(line))
        ids = spool_reader.span_line_ids(line)
        if ids is None:
            return True  # not laid out as ours: parse it, and ask of the dict
        return self._keep(ids[2], ids[0], ids[1], _plain(line))

    def __call__(self, span: dict[str, Any]) -> bool:
        plain = not (span.get("events") or span.get("links") or span.get("status"))
        return self._keep(span.get("name"), span.get("spanId"), span.get("parentSpanId"), plain)

    def _keep(self, name: Any, span_id: Any, parent: Any, plain: bool) -> bool:
        if name in self.rows:
            return span_id not in self.steps or span_id in self.partial
        if plain and name in self.parts and parent in self.steps:
            self.passed_over += 1
            return False
        return True


def _plain(line: str) -> bool:
    """A span line with no event, link or status: it only makes its part of a step."""
    return '"events":' not in line and '"links":' not in line and '"status":' not in line
