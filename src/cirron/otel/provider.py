"""The global OpenTelemetry tracer provider, shared rather than replaced.

If the process already has an SDK ``TracerProvider`` (one made by
``opentelemetry-instrument`` or by the user), cirron adds its processor to it
and replaces nothing. Otherwise it makes one with cirron's resource and sets
it as the global provider. A provider cirron made for an earlier
``ci.profile()`` (ended with ``ci.shutdown()``) is replaced by the new one.

The provider's other processors (the configurator's ``BatchSpanProcessor``
under ``opentelemetry-instrument``, a user's) are flushed with cirron's own,
within the same bound: :class:`OthersFlush`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import environment as env
from . import ids, spans
from .resource import build_resource, run_id
from .threads import daemon_thread

_log = logging.getLogger("cirron")
_made_by_us: weakref.WeakSet[TracerProvider] = weakref.WeakSet()


def _set_global(provider: TracerProvider) -> None:
    current = trace.get_tracer_provider()
    if current in _made_by_us:
        # Our own provider from an earlier profile(): the API allows setting the
        # global provider once, so undo that first.
        spans.forget_global_provider()
    elif not isinstance(current, trace.ProxyTracerProvider):
        _log.info(
            "cirron: the global tracer provider is not an SDK provider; "
            "cirron records with its own provider and leaves the global one alone"
        )
        return
    trace.set_tracer_provider(provider)


def obtain(span_limits: Any) -> tuple[TracerProvider, bool]:
    """The provider to record with, and whether cirron made it."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider) and current not in _made_by_us:
        return current, False
    provider = TracerProvider(
        resource=build_resource(),
        span_limits=span_limits,
        shutdown_on_exit=False,
        id_generator=ids.ID_GENERATOR,  # ids no seed of the program can repeat
    )
    _made_by_us.add(provider)
    _set_global(provider)
    return provider, True


def remove_processor(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Detach ``processor``; the SDK has no public way, so this may do nothing."""
    if not spans.remove_span_processor(provider, processor):
        _log.debug("cirron: could not detach the span processor from the provider")


class OthersFlush:
    """A bounded ``force_flush`` of the provider's processors other than ``ours``, begun now.

    ``BatchSpanProcessor.force_flush`` ignores its timeout: it waits for the
    exporter's retries (up to ``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s, against an
    unreachable endpoint). So each flushes on a thread of its own (one stuck
    exporter holds up no other), and :meth:`wait` waits for them only until a
    deadline.
    """

    def __init__(self, provider: Any, ours: SpanProcessor, timeout: float) -> None:
        self._flushing: list[tuple[SpanProcessor, threading.Thread]] = []
        for processor in spans.span_processors(provider):
            if processor is ours:
                continue
            thread = daemon_thread(
                _flush, "cirron-flush-provider", (processor, int(timeout * 1000))
            )
            thread.start()
            self._flushing.append((processor, thread))

    def wait(self, deadline: float) -> list[SpanProcessor]:
        """Wait until every flush ended, or ``deadline`` (``time.monotonic()``); returns the
        processors still flushing."""
        for _, thread in self._flushing:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [processor for processor, thread in self._flushing if thread.is_alive()]


def _flush(processor: SpanProcessor, timeout_millis: int) -> None:
    try:
        processor.force_flush(timeout_millis)  # (a BatchSpanProcessor ignores it)
    except Exception as error:  # noqa: BLE001 - someone else's processor never breaks exit
        _log.debug("cirron: flushing %s failed: %s", type(processor).__name__, error)


def cut_short(provider: Any, processors: Sequence[SpanProcessor], waited: float) -> None:
    """The process is ending and ``processors`` are still exporting after ``waited`` seconds:
    shut their exporters down, which ends their retries, and take them off the provider.

    Otherwise the SDK's own exit hook, which runs after cirron's, would wait
    for those retries (up to 10 s), then shut them down a second time. What
    they had not delivered is lost (it is in the spool, when the spool is on).
    """
    for processor in processors:
        spans.remove_span_processor(provider, processor)
        for exporter in spans.exporters_of_processor(processor):
            _log.warning(
                "cirron: %s was still exporting %.3g s after the end of the program "
                "(CIRRON_EXIT_TIMEOUT); the spans it had not delivered are dropped",
                type(exporter).__name__,
                waited,
            )
            try:
                exporter.shutdown()
            except Exception as error:  # noqa: BLE001 - someone else's exporter never breaks exit
                _log.debug("cirron: shutting %s down failed: %s", type(exporter).__name__, error)


def exports_otlp_already(provider: TracerProvider) -> bool:
    """True when the (reused) provider already has an OTLP exporter of its own."""
    return any(
        type(exporter).__module__.startswith("opentelemetry.exporter.otlp")
        for exporter in spans.exporters_of(provider)
    )


def parent_from_environment() -> otel_context.Context | None:
    """The context of ``TRACEPARENT`` (and ``TRACESTATE``), when set."""
    traceparent = os.environ.get(env.TRACEPARENT, "").strip()
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if os.environ.get(env.TRACESTATE):
        carrier["tracestate"] = os.environ[env.TRACESTATE]
    context = TraceContextTextMapPropagator().extract(carrier, context=otel_context.Context())
    if not trace.get_current_span(context).get_span_context().is_valid:
        _log.warning("cirron: ignoring invalid TRACEPARENT=%r", traceparent)
        return None
    return context


def run_root() -> otel_context.Context | None:
    """The run's virtual root, when this process belongs to a run (a run id is set).

    Every process of the run derives the same trace id from the run id
    (:func:`cirron.otel.ids.run_ids`), so one trace holds every rank. cirron's own
    sessions are roots of that trace; a session the SDK has to start (a
    custom sampler or id generator) gets this never-recorded span as its
    parent, the one way to give the SDK a trace id.
    """
    run = run_id()
    if run is None:
        return None
    trace_id, span_id = ids.run_ids(run)
    root = trace.NonRecordingSpan(
        trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(1))
    )
    return trace.set_span_in_context(root, otel_context.Context())
