"""cirron's OpenTelemetry instruments, on every meter it records to, and each measurement kept.

One :class:`Instruments` per profiler holds the instruments on each meter (the program's
``MeterProvider``, cirron's own, or both) and records every value into all of them and
into :class:`~cirron.metrics.recorded.Recorded` (``ci.metrics()``). A value is recorded in
the context of the span it came from, as a ``NonRecordingSpan`` of that span's context:
the SDK's default exemplar filter (``trace_based``) then keeps the trace and span id with
the value, the link from a metric point back to its step.

A point mark becomes a histogram named after the mark, created the first time the mark is
seen. A histogram and not a gauge: a mark is recorded many times between two exports (a
loss every step, an export every second or minute), and a synchronous gauge keeps only the
last of them, losing the spikes that an exemplar should lead to; a histogram keeps count,
sum, min, max and the distribution, and its exemplar reservoir keeps the latest value of
each bucket, so the extreme buckets point at the extreme steps. Its buckets
(:data:`MARK_BOUNDARIES`, an advisory any View overrides) span 0.001 to 1000 in 1-2.5-5
steps. The price: OpenTelemetry's histograms take no negative value (the SDK drops it). A
mark whose value is not a number (a str, a bool), not finite or negative is left out of the
metrics, with one warning per name; the span keeps it (mark ``-reward`` for a reward that is
mostly negative).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import NonRecordingSpan, SpanContext

from ..otel import semconv
from ..otel.health import Health, printable
from .recorded import Recorded

_log = logging.getLogger("cirron")
METER_NAME = "cirron"
# Buckets of a mark's histogram: 0.001 .. 1000 in 1-2.5-5 steps (loss, accuracy, lr, norms).
MARK_BOUNDARIES = (
    0.0, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0,
)  # fmt: skip
# Seconds: a step's part, 0.1 ms .. 1 min.
DURATION_BOUNDARIES = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
# Bytes: 16 MiB .. 1 TiB in powers of two (host and device memory).
BYTES_BOUNDARIES = tuple(float(2**power) for power in range(24, 41))
_VALID_NAME = re.compile(r"[A-Za-z][-_./A-Za-z0-9]{0,254}")
_INVALID_CHARACTER = re.compile(r"[^-_./A-Za-z0-9]")
# The asynchronous kinds, as OpenTelemetry names their instruments (ci.metrics()'s "kind").
_OBSERVABLE_KINDS = {
    "gauge": "ObservableGauge",
    "counter": "ObservableCounter",
    "up_down_counter": "ObservableUpDownCounter",
}
Callback = Callable[[], Iterable[tuple[float | int, Mapping[str, Any]]]]


def instrument_name(mark: str) -> str:
    """The instrument a mark is recorded in: its name, made valid for OpenTelemetry
    (``val loss`` -> ``val_loss``, ``1st`` -> ``mark_1st``) where it is not."""
    if _VALID_NAME.fullmatch(mark):
        return mark
    name = _INVALID_CHARACTER.sub("_", mark)
    if not name[:1].isalpha() or not name[:1].isascii():
        name = "mark_" + name
    return name[:255]


def span_context_of(context: SpanContext | None) -> Context | None:
    """The OTel context that makes ``context``'s span the measurement's (for its exemplar)."""
    if context is None or not context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(context))


class Instruments:
    """The instruments on ``meters`` and the record of every value; see the module docstring."""

    def __init__(self, meters: Sequence[Meter], recorded: Recorded, health: Health) -> None:
        self.meters = list(meters)
        self.recorded = recorded
        self.health = health
        # Per synchronous instrument, its record (histogram) or add (counter) on each meter.
        self._writers: dict[str, list[Callable[..., None]]] = {}
        # Per summed counter, its totals: attribute items -> [total, attributes].
        self._totals: dict[str, dict[int, list[Any]]] = {}
        self._marks: dict[str, str] = {}  # mark name -> instrument name
        self._reserved: set[str] = set()
        self._pid = os.getpid()
        self.non_finite: dict[str, int] = {}  # mark name -> its values left out as not finite

    @property
    def marks(self) -> dict[str, str]:
        """Each mark's name -> the instrument its values are recorded in."""
        return dict(self._marks)

    def totals(self, name: str) -> list[tuple[float | int, Mapping[str, Any]]]:
        """The totals of summed counter ``name`` so far, one per attribute set."""
        return [(total, attributes) for total, attributes in list(self._totals[name].values())]

    # -- creating -------------------------------------------------------------------------
    def histogram(
        self, name: str, unit: str, description: str, boundaries: Sequence[float]
    ) -> None:
        self._reserved.add(name)
        self.recorded.describe(name, "Histogram", unit, description)
        self._writers[name] = [
            meter.create_histogram(
                name, unit, description, explicit_bucket_boundaries_advisory=boundaries
            ).record
            for meter in self.meters
        ]

    def counter(self, name: str, unit: str, description: str) -> None:
        self._reserved.add(name)
        self.recorded.describe(name, "Counter", unit, description)
        self._writers[name] = [
            meter.create_counter(name, unit, description).add for meter in self.meters
        ]

    def summed_counter(self, name: str, unit: str, description: str) -> None:
        """A counter whose increments (:meth:`add`) are summed here, per attribute set, and
        read by the SDK as an observable counter when a reader collects: an increment costs
        a dict update, where an SDK counter's ``add`` costs microseconds (for the counts of
        every step, on a thread that shares the interpreter with training)."""
        totals: dict[int, list[Any]] = {}
        self._totals[name] = totals
        self.observable(
            name,
            "counter",
            unit,
            description,
            lambda: [(total, attributes) for total, attributes in list(totals.values())],
        )
        self.recorded.describe(name, "Counter", unit, description)  # its rows: the increments

    def observable(
        self, name: str, kind: str, unit: str, description: str, callback: Callback
    ) -> None:
        """An asynchronous instrument (``gauge``, ``counter`` or ``up_down_counter``) whose
        observations are ``callback()``'s (value, attributes) pairs at each collection."""
        self._reserved.add(name)
        self.recorded.describe(name, _OBSERVABLE_KINDS[kind], unit, description)

        def observe(options: CallbackOptions) -> list[Observation]:
            if os.getpid() != self._pid:  # a forked child's reader: the figures are the parent's
                return []
            try:
                return [Observation(value, dict(attributes)) for value, attributes in callback()]
            except Exception as error:  # noqa: BLE001 - a reading that fails is left out
                self.health.failed(f"observing {name}", error, "export_errors")
                return []

        for meter in self.meters:
            create = {
                "gauge": meter.create_observable_gauge,
                "counter": meter.create_observable_counter,
                "up_down_counter": meter.create_observable_up_down_counter,
            }[kind]
            create(name, [observe], unit, description)

    # -- recording ------------------------------------------------------------------------
    def record(
        self,
        name: str,
        value: float | int,
        attributes: Mapping[str, Any],
        time_ns: int,
        span: SpanContext | None,
        context: Context | None,
    ) -> None:
        """``value`` into instrument ``name`` (a histogram or a counter) on every meter."""
        for write in self._writers[name]:
            write(value, attributes, context)
        self._kept(name, value, attributes, time_ns, span)

    def add(
        self,
        name: str,
        value: float | int,
        attributes: Mapping[str, Any],
        time_ns: int,
        span: SpanContext | None,
    ) -> None:
        """``value`` onto summed counter ``name`` (see :meth:`summed_counter`); the increment,
        with its span, into ``ci.metrics()``. ``attributes``: one of a few dicts that never
        change, each a series of its own (kept by identity: the entry holds it, so its id is
        never another's)."""
        totals = self._totals[name]
        entry = totals.get(id(attributes))
        if entry is None:
            totals[id(attributes)] = [value, attributes]
        else:
            entry[0] += value  # one thread adds (the metrics sink's)
        self._kept(name, value, attributes, time_ns, span)

    def add_each(
        self,
        name: str,
        values: list[tuple[float | int, Mapping[str, Any]]],
        time_ns: int,
        span: SpanContext | None,
    ) -> None:
        """:meth:`add` of each (value, attributes) in ``values``, in one call (a step's time
        by part: the sink's thread adds them for every step)."""
        totals = self._totals[name]
        for value, attributes in values:
            entry = totals.get(id(attributes))
            if entry is None:
                totals[id(attributes)] = [value, attributes]
            else:
                entry[0] += value
        trace_id, span_id = (span.trace_id, span.span_id) if span is not None else (0, 0)
        self.recorded.add_many(name, time_ns, values, trace_id, span_id)

    def _kept(
        self,
        name: str,
        value: float | int,
        attributes: Mapping[str, Any],
        time_ns: int,
        span: SpanContext | None,
    ) -> None:
        """A value into ``ci.metrics()``, with the ids of the span it came from."""
        trace_id, span_id = (span.trace_id, span.span_id) if span is not None else (0, 0)
        self.recorded.add(name, time_ns, value, attributes, trace_id, span_id)

    def keep(
        self, name: str, time_ns: int, value: float | int, attributes: Mapping[str, Any]
    ) -> None:
        """A sample of an asynchronous instrument, into ``ci.metrics()`` only (the SDK reads
        it through the instrument's callback)."""
        self.recorded.add(name, time_ns, value, attributes)

    def mark(
        self,
        mark: str,
        value: Any,
        attributes: Mapping[str, Any],
        time_ns: int,
        span: SpanContext | None,
        context: Context | None,
    ) -> bool:
        """A point mark's value into the histogram named after it (made the first time);
        False when the value is left out (not a number, not finite, or negative)."""
        if type(value) is bool or not isinstance(value, (int, float)):
            self._skip(mark, value, f"a {type(value).__name__}")
            return False
        if not math.isfinite(value) or value < 0:
            if not math.isfinite(value):  # (the end-of-run summary says it)
                self.non_finite[mark] = self.non_finite.get(mark, 0) + 1
            why = "negative: OpenTelemetry's histograms take values >= 0" if value < 0 else ""
            self._skip(mark, value, why or "not finite")
            return False
        name = self._marks.get(mark)
        if name is None:
            name = self._mark_instrument(mark)
        self.record(name, value, attributes, time_ns, span, context)
        return True

    def _mark_instrument(self, mark: str) -> str:
        name = instrument_name(mark)
        if name in self._reserved and name not in self._marks.values():
            name = semconv.MARK_PREFIX + name  # a mark named like one of cirron's own instruments
        if name not in self._writers:
            self.histogram(name, "", f"the values of ci.mark({mark!r})", MARK_BOUNDARIES)
        self._marks[mark] = name
        return name

    def _skip(self, mark: str, value: Any, what: str) -> None:
        self.health.warn_once(
            f"mark-metric-{mark}",
            "cirron: mark %r has a value that is %s (%s): it stays on the span but is left out "
            "of the metrics (said once per mark)",
            printable(mark),
            what,
            printable(repr(value), 40),
        )
