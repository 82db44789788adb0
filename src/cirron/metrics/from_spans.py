"""Metrics derived from the spans, on a sink's thread: the training thread does nothing more.

:class:`SpanMetrics` is a ``SpanExporter`` behind a sink worker of its own: it gets every
batch of ended spans the flush thread hands out, and records, in the context of the span
each figure came from (so that its exemplar names that span):

- each point mark (an event with a ``value``): its value, into the histogram named after
  the mark, with the mark's other attributes;
- each step (``step`` spans; a run with none, Keras: its ``batch`` spans): its wall time into
  the ``cirron.step.duration`` histogram, its time by part onto ``cirron.step.time``
  (``cirron.step.part`` = ``data_load``, ``forward``, ``backward``, ``optimizer_step``, or
  ``other`` for the rest; a part nested in another, Lightning's forward inside
  ``optimizer_step``, counts once, as the report counts it), one on ``cirron.steps``, and the
  ``cpu_ns``, RSS and CUDA peaks of a measured step into their histograms. The time by part
  and the count are summed counters: an SDK histogram's ``record`` costs about 8 us, and
  this thread shares the interpreter with training; one a step is what it costs;
- each epoch: one on ``cirron.epochs``, and the epoch's line (``stdout``/``log``).

No ``cirron.samples`` counter: no span carries a batch size, so the count of samples is
not known.

A span's marks are recorded when it arrives. Its step figures wait one batch, with the
spans of the next batch that ended before it: a forward whose GPU time was not known yet
reaches the sink one flush after its step, and must still count in that step. What waits
is a few fields of each span, in columns (:class:`~cirron.metrics.waiting.Waiting`: no
object a span), never the span with its events (but a step's or an epoch's); the parts of
a step travel up as a small tree of part spans, keyed by parent.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext

from ..exporters.lines import is_point_mark
from ..otel import semconv
from ..otel.health import Health
from ..otel.spans import ScopeSpan, span_ids
from .instruments import Instruments, span_context_of
from .summary import EpochSummary
from .waiting import Waiting

OTHER = "other"  # the part of a step no part span accounts for
# Spans that never sit inside a step: the part spans below them count for no step.
_ABOVE_STEPS = frozenset((semconv.SESSION, semconv.TRAIN, semconv.EPOCH, *semconv.PASSES))
_HELD = frozenset((semconv.STEP, semconv.BATCH, semconv.EPOCH))  # held whole: a figure reads them
_PARTS = frozenset(semconv.STEP_PARTS)  # with _HELD, the spans a figure comes from
_MAX_PENDING = 10_000  # parents with part spans waiting for them; past it the oldest go
# Part spans waiting under one parent past which those of one name are summed (merged).
_MAX_PARTS = 256
# Attributes shared by every value that has them (ci.metrics() keeps a reference per value).
_TOTALS = (*semconv.STEP_PARTS, OTHER)
_PART_ATTRIBUTES = {part: {semconv.STEP_PART: part} for part in _TOTALS}
_NO_ATTRIBUTES: dict[str, Any] = {}
_NO_PARTS: list[Part] = []  # never changed: a span with no part spans inside
_STEP = semconv.STEP
# Per-step attribute -> (instrument, scale to its unit).
STEP_FIGURES = {
    semconv.CPU_NS: (semconv.STEP_CPU_TIME, 1e-9),
    semconv.PROCESS_MEMORY_USAGE: (semconv.STEP_MEMORY_USAGE, 1),
    semconv.CUDA_MEMORY_PEAK_ALLOCATED: (semconv.STEP_CUDA_MEMORY_PEAK_ALLOCATED, 1),
    semconv.CUDA_MEMORY_PEAK_RESERVED: (semconv.STEP_CUDA_MEMORY_PEAK_RESERVED, 1),
}


class Part(NamedTuple):
    """A part span of a step (``forward``, ...) and the part spans inside it."""

    name: str
    duration_ns: int
    inside: list[Part]


def step_parts(parts: list[Part], wall_ns: int, data_load_ns: Any = None) -> dict[str, int]:
    """Nanoseconds of a step in each part and in ``other``; a part nested in a part of
    another name is that part's time, not its parent's too (:mod:`cirron.offline.steps`)."""
    totals = dict.fromkeys(_TOTALS, 0)
    for node in parts:  # _walk(parts, None, totals), a part with nothing inside it inline
        if node.inside:
            _walk((node,), None, totals)
        else:  # (a step's forward, backward, ...: the common case, for every step of a run)
            totals[node.name] += node.duration_ns
    if type(data_load_ns) is int:
        totals[semconv.DATA_LOAD] += data_load_ns  # a ci.batches batch's wait for its loader
    totals[OTHER] = max(wall_ns - sum(totals.values()), 0)  # (OTHER is 0 until now)
    return totals


def merged(parts: list[Part]) -> list[Part]:
    """``parts`` with the siblings of one name made one (their times summed, their insides
    merged the same way): :func:`step_parts` gives the same totals for both, as it only adds
    and subtracts times, and the parts held for one step stay a few whatever its forwards."""
    by_name: dict[str, tuple[int, list[Part]]] = {}
    for part in parts:
        duration, inside = by_name.get(part.name, (0, []))
        inside.extend(part.inside)
        by_name[part.name] = (duration + part.duration_ns, inside)
    return [Part(name, duration, merged(inside)) for name, (duration, inside) in by_name.items()]


def _walk(nodes: Sequence[Part], current: str | None, totals: dict[str, int]) -> None:
    """:func:`step_parts`' sum over a tree of parts. A function of the module, not a closure
    inside it: a closure that calls itself is a reference cycle, left to the garbage
    collector once a step (three objects a step that bring its passes sooner)."""
    for node in nodes:
        if node.name == current:  # a forward inside a forward: the outer one counts
            _walk(node.inside, current, totals)
            continue
        totals[node.name] += node.duration_ns
        if current is not None:
            totals[current] -= node.duration_ns
        _walk(node.inside, node.name, totals)


class Ended(NamedTuple):
    """What the step figures need of a held span that gives figures (a step, a part, an
    epoch), made when it is handled. The span itself is there only for a step or an epoch
    (its context is its measurements' exemplar)."""

    name: str
    span_id: int
    parent_id: int | None
    duration_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    span: ReadableSpan | None  # a step's or an epoch's

    @property
    def context(self) -> SpanContext | None:
        """The held span's context: its measurements' exemplar."""
        return self.span.get_span_context() if self.span is not None else None


class SpanMetrics(SpanExporter):
    """The sink that turns ended spans into measurements; see the module docstring."""

    def __init__(
        self,
        instruments: Instruments,
        summary: EpochSummary | None,
        health: Health,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        """``on_shutdown``: called once the last spans were handled (the sink worker stops)."""
        self.instruments = instruments
        self.summary = summary
        self.health = health
        self.on_shutdown = on_shutdown
        self._held = Waiting()
        self._parts: collections.OrderedDict[int, list[Part]] = collections.OrderedDict()
        self._seen_step = False  # a run with step spans: its batch spans are not steps
        self._lock = threading.Lock()  # export (the sink's thread) and flush (the caller's)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            held = self._held
            cutoff = max(held.end) if held else None
            self._arrive(spans)
            if cutoff is not None:  # what ended by the last batch's end is handled now
                held.sort()
                self._handle(held.take_until(cutoff))
        return SpanExportResult.SUCCESS

    def flush(self) -> None:
        """Handle every span held (``ci.flush()``, the end of the run)."""
        with self._lock:
            self._held.sort()
            self._handle(self._held.take_until())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.flush()
        return True

    def shutdown(self) -> None:
        self.flush()
        if self.on_shutdown is not None:
            self.on_shutdown()

    # -- a span arrives: its marks now, the rest held -------------------------------------
    def _arrive(self, spans: Sequence[ReadableSpan]) -> None:
        """Hold each span's fields a batch, its marks recorded now. One loop for the batch,
        cirron's spans read field by field: it runs for every span of the run."""
        add_end, add_name, add_id, add_parent, add_duration, add_span = self._held.appends()
        for span in spans:
            try:
                if type(span) is not ScopeSpan:
                    self._arrive_other(span)
                    continue
                if span._events:
                    self._marks(span, span.get_span_context())
                name, parent = span._name, span._parent_span
                if parent is None:
                    parent_id = None
                elif type(parent) is ScopeSpan:
                    parent_id = parent._span_id
                else:
                    parent_id = parent.get_span_context().span_id
                end, start, span_id = span._end_time or 0, span._start_time or 0, span._span_id
                duration = end - start if end > start else 0
                # Every field read before the first is held: an error holds no span half.
                add_end(end)
                add_name(name)
                add_id(span_id)
                add_parent(parent_id)
                add_duration(duration)
                add_span(span if name in _HELD else None)
            except Exception as error:  # noqa: BLE001 - one span's figures, not the rest
                self.health.failed("metrics from spans", error, "export_errors")

    def _arrive_other(self, span: ReadableSpan) -> None:
        """:meth:`_arrive` for a span not of cirron's (an SDK span): through its properties."""
        span_id, parent_id = span_ids(span)
        if span.events:
            context = span.get_span_context()
            if context is not None:
                self._marks(span, context)
        name = span.name
        end, start = span.end_time or 0, span.start_time or 0
        duration = end - start if end > start else 0
        self._held.add(end, name, span_id, parent_id, duration, span if name in _HELD else None)

    def _marks(self, span: ReadableSpan, context: SpanContext) -> None:
        otel_context = span_context_of(context)
        mark = self.instruments.mark
        for event in span.events:
            if is_point_mark(event):
                found: Any = event.attributes
                value = found[semconv.MARK_VALUE]
                attributes = (
                    {k: v for k, v in found.items() if k != semconv.MARK_VALUE}
                    if len(found) > 1
                    else _NO_ATTRIBUTES
                )
                kept = mark(event.name, value, attributes, event.timestamp, context, otel_context)
                if kept and self.summary is not None:
                    self.summary.mark(event.name, value, event.timestamp)

    # -- one held span at a time, children before parents ---------------------------------
    def _handle(self, held: Waiting) -> None:
        """``held``, sorted by end: children before their parents."""
        parts = self._parts
        for end, name, span_id, parent_id, duration, span in held:
            try:
                if name in _PARTS:  # most spans of a run: up to the step, no record made
                    part = Part(name, duration, parts.pop(span_id, _NO_PARTS))
                    waiting = parts.get(parent_id) if parent_id is not None else None
                    if waiting is not None and len(waiting) < _MAX_PARTS:
                        waiting.append(part)  # _pass_up's common case, inline (4 a step)
                    else:
                        self._pass_up(parent_id, [part])
                    continue
                if name == _STEP:  # a step's figures, read from its span
                    self._seen_step = True
                    self._step(span, duration, end, parts.pop(span_id, _NO_PARTS))
                    continue
                if name in _HELD:  # a batch or an epoch
                    attributes = (
                        _NO_ATTRIBUTES if span is None else span.attributes or _NO_ATTRIBUTES
                    )
                    self._ended(Ended(name, span_id, parent_id, duration, end, attributes, span))
                    continue
                # Any other span (most of them): only the parts inside it, if any, go up.
                inside = parts.pop(span_id, None)
                if inside and name not in _ABOVE_STEPS:
                    self._pass_up(parent_id, inside)  # a scope between a step and its parts
            except Exception as error:  # noqa: BLE001 - one span's figures, not the rest
                self.health.failed("metrics from spans", error, "export_errors")

    def _ended(self, ended: Ended) -> None:
        """A batch or an epoch (a step and a part span are :meth:`_handle`'s own)."""
        name = ended.name
        inside = self._parts.pop(ended.span_id, _NO_PARTS)
        if name == semconv.BATCH and not self._seen_step:  # a run with no steps: a step
            self._step(ended.span, ended.duration_ns, ended.end_ns, inside)
        elif name == semconv.EPOCH:
            self._epoch(ended)
        elif inside and name not in _ABOVE_STEPS:
            self._pass_up(ended.parent_id, inside)  # a batch inside a step

    def _pass_up(self, parent_id: int | None, parts: list[Part]) -> None:
        if parent_id is None:
            return
        waiting = self._parts.setdefault(parent_id, [])
        waiting.extend(parts)
        if len(waiting) > _MAX_PARTS:  # a step that never arrives (dropped) or a long one
            self._parts[parent_id] = merged(waiting)
        if len(self._parts) > _MAX_PENDING:
            self._parts.popitem(last=False)

    def _step(self, step: ReadableSpan | None, wall: int, end: int, inside: list[Part]) -> None:
        """The figures of a step (or of a batch, in a run with no steps) that took ``wall``
        ns and ended at ``end``, with ``inside`` its part spans."""
        record, add = self.instruments.record, self.instruments.add
        attributes = (step.attributes if step is not None else None) or _NO_ATTRIBUTES
        span = step.get_span_context() if step is not None else None
        context = span_context_of(span)
        record(semconv.STEP_DURATION, wall / 1e9, _NO_ATTRIBUTES, end, span, context)
        by_part = step_parts(inside, wall, attributes.get(semconv.DATA_LOAD_NS))
        self.instruments.add_each(
            semconv.STEP_TIME,
            [
                (ns / 1e9, _PART_ATTRIBUTES[part])
                for part, ns in by_part.items()
                if ns > 0 or part == OTHER
            ],
            end,
            span,
        )
        add(semconv.STEP_COUNT, 1, _NO_ATTRIBUTES, end, span)
        for attribute, (instrument, scale) in STEP_FIGURES.items():
            value = attributes.get(attribute)
            if value is not None and _numeric(value):  # (most steps are not measured)
                scaled = value * scale if scale != 1 else value
                record(instrument, scaled, _NO_ATTRIBUTES, end, span, context)
        if self.summary is not None:
            self.summary.step(
                wall,
                attributes.get(semconv.CPU_NS),
                attributes.get(semconv.PROCESS_MEMORY_USAGE),
                attributes.get(semconv.CUDA_MEMORY_PEAK_ALLOCATED),
            )

    def _epoch(self, ended: Ended) -> None:
        span = ended.context
        self.instruments.record(
            semconv.EPOCH_COUNT, 1, _NO_ATTRIBUTES, ended.end_ns, span, span_context_of(span)
        )
        if self.summary is not None:
            self.summary.epoch_ended(ended.attributes.get(semconv.INDEX), ended.end_ns)


def _numeric(value: Any) -> TypeGuard[float | int]:
    return type(value) in (int, float) and value == value and abs(value) != float("inf")
