"""Who records right now: the profiler's recorder, or an in-memory one.

``ci.scope``/``ci.mark`` work with or without ``ci.profile()``. Without it,
the first call builds a private in-memory recorder (its own SDK provider, not
the global one, no threads, no files) so that ``ci.trace()`` can still show
the tree. ``ci.profile()`` replaces it with the real one; ``enabled=False``
installs a disabled recorder that makes every scope a shared no-op.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanLimits, TracerProvider

from ..config import Settings
from ..otel import ids, semconv, values
from ..otel.health import Health
from ..otel.processor import RingBufferSpanProcessor
from ..otel.spans import ScopeSpan, TracerState, add_span_processor_first, lean_path_possible
from ..otel.store import TraceStore
from ..otel.version import __version__
from .training_state import TrainingState

TRACER_NAME = "cirron"
SESSION_SPAN = semconv.SESSION
MAX_VALUE_LENGTH = values.MAX_VALUE_LENGTH  # characters kept of a string attribute value


@dataclass(slots=True)
class Recorder:
    """Everything one run records with: where spans go, and what the run has learned so far.

    Its fields are slots: the compiled twins (:mod:`cirron.recording.hot`) read them by
    offset, several times a step."""

    enabled: bool
    health: Health
    settings: Settings = field(default_factory=Settings)  # ci.profile()'s, or the defaults
    store: TraceStore | None = None
    tracer: Any = None
    processor: RingBufferSpanProcessor | None = None
    session: Any = None  # the open cirron.session span
    session_context: Any = None  # an OTel Context holding the session span
    lean: TracerState | None = None  # the fast span path, when the provider allows it
    writes_files: bool = False  # made by ci.profile(): raw snapshot files may be written
    in_memory: bool = False  # made by the first scope without ci.profile(): no profiler
    watched: dict[str, weakref.ref[Any]] = field(default_factory=dict)  # ci.watch, by name
    training: TrainingState = field(default_factory=TrainingState)  # the open epoch and step
    signal: str | None = None  # the signal that is ending the process (SIGTERM, SIGINT)

    def __post_init__(self) -> None:
        self.training.measure_every_ns = int(self.settings.step_resources_interval * 1e9)

    def watched_models(self) -> dict[str, Any]:
        """The watched models still alive, by name."""
        models = {name: reference() for name, reference in list(self.watched.items())}
        return {name: model for name, model in models.items() if model is not None}


current: Recorder | None = None
_lock = threading.Lock()


def span_limits(max_events: int) -> SpanLimits:
    # Marks are span events: the SDK default of 128 per span would silently
    # cut a long epoch's loss curve. Attribute values are capped so a 10 MB
    # string can't bloat a spool file (documented in the README).
    return SpanLimits(max_events=max_events, max_attribute_length=MAX_VALUE_LENGTH)


def _tracer(provider: TracerProvider, max_events: int) -> tuple[trace.Tracer, TracerState | None]:
    """cirron's tracer on ``provider``, and the lean span path when the provider allows it."""
    tracer = provider.get_tracer(TRACER_NAME, __version__)
    if ids.private_ids(getattr(tracer, "id_generator", None)):
        # Our own tracer only (the SDK path: a custom sampler); other tracers of
        # a provider we did not make keep the generator it was given.
        tracer.id_generator = ids.ID_GENERATOR  # type: ignore[attr-defined]
    if not lean_path_possible(provider):
        return tracer, None
    return tracer, TracerState(provider, tracer, max_events, MAX_VALUE_LENGTH)


def start_session(
    provider: TracerProvider,
    attributes: dict[str, Any],
    health: Health,
    store: TraceStore,
    processor: RingBufferSpanProcessor,
    settings: Settings,
    parent: Any = None,
    run: Any = None,
) -> Recorder:
    """Open ``cirron.session``: a child of ``parent`` (``TRACEPARENT``), else a root.

    ``run``: the run's virtual root (:func:`cirron.otel.provider.run_root`): the
    session is a root of the run's trace.
    """
    tracer, lean = _tracer(provider, settings.max_events)
    root_context = parent if parent is not None else otel_context.Context()
    if lean is not None:
        remote = trace.get_current_span(root_context)
        remote_context = remote.get_span_context()
        if remote_context.is_valid:
            trace_id = remote_context.trace_id
        elif run is not None:  # a root, in the trace every process of the run shares
            trace_id = trace.get_current_span(run).get_span_context().trace_id
        else:
            trace_id = lean.new_trace_id()
        session: Any = ScopeSpan(
            SESSION_SPAN,
            trace_id,
            remote if remote_context.is_valid else None,
            dict(attributes),
            lean,
            root_context,
        )
    else:
        if parent is None and run is not None:
            root_context = run
        session = tracer.start_span(SESSION_SPAN, context=root_context, attributes=attributes)
    return Recorder(
        enabled=True,
        health=health,
        settings=settings,
        store=store,
        tracer=tracer,
        processor=processor,
        session=session,
        session_context=trace.set_span_in_context(session, otel_context.Context()),
        lean=lean,
    )


def session_attributes(frameworks: tuple[str, ...] = ()) -> dict[str, Any]:
    # Instrumentors refine device, cuda_count and mixed_precision on the open
    # session span once they know them; the core knows no framework.
    return {
        semconv.FRAMEWORK: list(frameworks),
        semconv.DEVICE: "cpu",
        semconv.CUDA_COUNT: 0,
        semconv.MIXED_PRECISION: False,
    }


def _memory_only(settings: Settings) -> tuple[Health, TraceStore, RingBufferSpanProcessor]:
    """Health, store and a processor with no sinks: spans kept for ci.trace() only."""
    health = Health()
    store = TraceStore(settings.trace_buffer)
    processor = RingBufferSpanProcessor(
        store, health, (), settings.buffer_size, settings.flush_interval, settings.exit_timeout
    )
    return health, store, processor


def _in_memory() -> Recorder:
    settings = Settings()
    health, store, processor = _memory_only(settings)
    provider = TracerProvider(
        shutdown_on_exit=False,
        span_limits=span_limits(settings.max_events),
        id_generator=ids.ID_GENERATOR,
    )
    provider.add_span_processor(processor)
    recorder = start_session(provider, session_attributes(), health, store, processor, settings)
    recorder.in_memory = True  # ci.trace() then reports enabled=False: no profiler
    return recorder


def bind_provider(provider: TracerProvider) -> Recorder:
    """A recorder on the user's own provider, for instrumentors used with plain OTel.

    No ``cirron.session`` (spans with no open parent become roots), no sinks,
    no threads: the user's processors export; the store keeps ``ci.trace()``.
    """
    settings = Settings()
    health, store, processor = _memory_only(settings)
    add_span_processor_first(provider, processor)
    tracer, lean = _tracer(provider, settings.max_events)
    bound = Recorder(
        enabled=True,
        health=health,
        settings=settings,
        store=store,
        tracer=tracer,
        processor=processor,
        lean=lean,
    )
    replace(bound)
    return bound


def active() -> Recorder:
    """The recorder scopes and marks go to, building the in-memory one if needed."""
    global current
    recorder = current
    if recorder is not None:
        return recorder
    with _lock:
        if current is None:
            current = _in_memory()
        return current


def current_health() -> Health:
    return active().health


def replace(recorder: Recorder | None) -> Recorder | None:
    """Install ``recorder`` as the current one; returns the previous one."""
    global current
    with _lock:
        previous, current = current, recorder
    return previous
