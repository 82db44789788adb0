"""A lean span for cirron's scopes that is still a real SDK ``ReadableSpan``.

The stock SDK span costs ~20 us per ``with`` on this class of machine: a lock
per span, validated attribute containers, a sampler call, an eager
``SpanContext`` and a full copy into a new ``ReadableSpan`` at ``end()``.
Scopes don't need most of that: their attributes are validated once by
``ci.scope``, their sampler is the default one, and the span object itself
can be handed to the span processors at ``end()`` because it *is* a
``ReadableSpan`` (it subclasses it) and nothing changes it after it ended.

What stays exactly OpenTelemetry: span processors' ``on_start``/``on_end``
see every span (so user processors and exporters on a shared provider get
ours), the span is the current span in the OTel context while open (so other
instrumentation nests under it), and every reader of ``ReadableSpan``
(exporters, the OTLP encoder, ``to_json``) sees the usual fields.

The ``SpanContext`` (0.8 us to build) is made lazily, the first time
something asks for it; most scopes are never asked.

This is also the one module that reaches OpenTelemetry's private names (the
last section): the context variable behind the OTel context, the provider's
tuple of span processors, the global provider's set-once guard, an SDK span's
lock and ended copy, the key that suppresses instrumentation. Each use says why, and what happens if an SDK version
lacks the name.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation import _SPAN_KEY

from . import ids, semconv, values

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

_log = logging.getLogger("cirron")
UNSET_STATUS = Status(StatusCode.UNSET)  # shared: encoders test for it by identity
_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)
_time_ns = time.time_ns
_random_bits = ids.random_bits  # cirron's own generator, never the program's `random`


def _clean_attribute(key: Any, value: Any, max_length: int) -> Any:
    """Validate an attribute set by other code on our span (None: drop it, as the SDK does)."""
    if not isinstance(key, str) or not key:
        _log.warning("cirron: invalid attribute key %r dropped", key)
        return None
    try:
        value = values.attribute(value, f"attribute {key!r}")
    except (TypeError, ValueError) as error:
        _log.warning("cirron: %s; attribute dropped", error)
        return None
    if type(value) is str and len(value) > max_length:
        return value[:max_length]
    if type(value) is tuple:
        return tuple(v[:max_length] if type(v) is str else v for v in value)
    return value


class MarkEvent(Event):
    """An SDK ``Event`` built without the generic path (attributes are pre-validated).

    Its fields are slots: no dict per event, and the compiled ``ci.mark`` fills them in
    (``cirron.recording._hot``).
    """

    __slots__ = ("_name", "_attributes", "_timestamp")

    def __init__(self, name: str, attributes: Mapping[str, Any], timestamp: int) -> None:
        self._name = name
        self._attributes = attributes
        self._timestamp = timestamp


class TracerState:
    """What every span of one tracer shares: resource, scope, processor, limits."""

    # Slots: the compiled helper reads the processors and random_ids by offset, every span.
    __slots__ = (
        "resource",
        "scope",
        "processors",
        "max_events",
        "max_value_length",
        "new_trace_id",
        "random_ids",
        "_generate_span_id",
        "_handlers_for",
        "_handlers",
    )

    def __init__(
        self, provider: TracerProvider, tracer: Any, max_events: int, max_value_length: int
    ) -> None:
        self.resource = provider.resource
        self.scope = (
            tracer.instrumentation_scope
            if hasattr(tracer, "instrumentation_scope")
            else tracer._instrumentation_scope
        )
        # The provider's multi-processor: its tuple of processors is read on
        # every span (it is replaced, never mutated, when one is added).
        self.processors: Any = provider._active_span_processor
        self.max_events = max_events
        self.max_value_length = max_value_length
        generator: Any = provider.id_generator
        if ids.private_ids(generator):  # nobody chose one: ids no seed can repeat
            generator = ids.ID_GENERATOR
        self.new_trace_id = generator.generate_trace_id
        self.random_ids = generator is ids.ID_GENERATOR
        self._generate_span_id = generator.generate_span_id
        self._handlers_for: Any = None  # the processors tuple _whole_handlers was made for
        self._handlers: tuple[Any, ...] = ()

    def new_span_id(self) -> int:
        span_id = self._generate_span_id()
        while span_id == 0:  # the invalid id
            span_id = self._generate_span_id()
        return span_id

    def whole_handlers(self) -> tuple[Any, ...]:
        """Per processor, what hands it a span that started and ended at once.

        A processor with ``on_start_and_end(span, parent_context)`` (cirron's
        own) does both in one call; any other gets ``on_start`` then ``on_end``.
        Remade when a processor is added (the provider replaces its tuple).
        """
        processors = self.processors._span_processors
        if processors is not self._handlers_for:
            self._handlers = tuple(_whole_handler(p) for p in processors)
            self._handlers_for = processors
        return self._handlers


def _whole_handler(processor: SpanProcessor) -> Callable[[ReadableSpan, Context | None], None]:
    both = getattr(processor, "on_start_and_end", None)
    if both is not None:
        return both

    def start_and_end(span: ReadableSpan, parent_context: Context | None) -> None:
        # Processors declare the SDK's Span; ours is the ReadableSpan they read from it.
        processor.on_start(span, parent_context)  # type: ignore[arg-type]
        processor.on_end(span)

    return start_and_end


def lean_path_possible(provider: trace_api.TracerProvider) -> bool:
    """The lean path replicates the default sampler only; anything else uses the SDK."""
    sampler = getattr(provider, "sampler", None)
    return (
        isinstance(provider, TracerProvider)
        and not getattr(provider, "_disabled", False)
        and hasattr(provider, "_active_span_processor")
        and isinstance(sampler, ParentBased)
        and getattr(sampler, "_root", None) is ALWAYS_ON
        and getattr(sampler, "_local_parent_sampled", None) is ALWAYS_ON
        and getattr(sampler, "_remote_parent_sampled", None) is ALWAYS_ON
    )


# Set once any span of the process was given an attribute to resolve later: until then the
# flush thread need not look for one in each batch (a run without a GPU never sets it).
DEFERRED_SEEN = [False]


class ScopeSpan(trace_api.Span, ReadableSpan):
    """A recording span of cirron's; see the module docstring."""

    # Every field a span is made with, or that every reader reads, is a slot: the compiled
    # helper reads and writes them by offset, and a span is smaller. What is made lazily
    # (_context, _parent) is in the instance's dict, which ReadableSpan's instances have.
    # Every slot is set where a span is made (here, finished(), and the compiled twin).
    __slots__ = (
        "_name",
        "_trace_id",
        "_span_id",
        "_parent_span",
        "_attributes",
        "_state",
        "_start_time",
        "_end_time",  # set once, by end()
        "_events",
        "_status",  # replaced by set_status
        "_links",
        # Attributes known only later, or None: (key, resolve, the attributes they go in:
        # None for the span's own, else an event's).
        "_deferred",
        "_dropped_events",
    )
    _kind = SpanKind.INTERNAL
    _attributes: dict[str, Any]  # type: ignore[assignment]
    _end_time: int | None
    _events: Any  # () until the first, then a list (a deque at the limit)
    _links: Any
    _status: Status
    _deferred: list[tuple[str, Any, Any]] | None
    _dropped_events: int
    _context: Any
    _parent: Any
    _instrumentation_info = None

    def __init__(
        self,
        name: str,
        trace_id: int,
        parent: Any,
        attributes: dict[str, Any],
        state: TracerState,
        parent_context: Any = None,
        start_time: int | None = None,
    ) -> None:
        self._name = name
        self._trace_id = trace_id
        # Inline for cirron's own generator (0 is invalid; a 1 in 2**64 redraw).
        self._span_id = (
            (_random_bits(64) or state.new_span_id()) if state.random_ids else state.new_span_id()
        )
        self._parent_span = parent  # a span, or None for a root
        self._attributes = attributes
        self._state = state
        self._start_time = start_time if start_time is not None else _time_ns()
        self._end_time = self._deferred = None
        self._events = self._links = ()
        self._status = UNSET_STATUS
        self._dropped_events = 0
        for processor in state.processors._span_processors:
            processor.on_start(self, parent_context)

    @classmethod
    def finished(
        cls,
        name: str,
        parent: ScopeSpan,
        attributes: dict[str, Any],
        parent_context: Any,
        start_time: int,
        end_time: int,
        deferred: tuple[str, Any] | None = None,
    ) -> ScopeSpan:
        """A child of ``parent`` that already ended, handed to the processors at once.

        For hook spans noted as timestamps (:mod:`cirron.recording.hook_spans`): the same
        span ``__init__`` then ``end()`` would make, for half the calls.
        ``deferred``: an attribute known only later (see :meth:`defer_attribute`).
        """
        span = cls.__new__(cls)
        state = parent._state
        span._name = name
        span._trace_id = parent._trace_id
        span._span_id = (
            (_random_bits(64) or state.new_span_id()) if state.random_ids else state.new_span_id()
        )
        span._parent_span = parent
        span._attributes = attributes
        span._state = state
        span._start_time = start_time
        span._events = span._links = ()
        span._status = UNSET_STATUS
        span._dropped_events = 0
        if deferred is not None:
            span._deferred = [(deferred[0], deferred[1], None)]
            DEFERRED_SEEN[0] = True
        else:
            span._deferred = None
        span._end_time = end_time
        for handler in state.whole_handlers():
            handler(span, parent_context)
        return span

    # -- lazily built, cached on first use -------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name == "_context":
            # Like the SDK's children, carry the parent's W3C trace state on.
            parent = self._parent_span
            trace_state = parent.get_span_context().trace_state if parent is not None else None
            context = trace_api.SpanContext(
                self._trace_id, self._span_id, False, _SAMPLED, trace_state
            )
            self._context = context
            return context
        if name == "_parent":
            parent = self._parent_span
            parent_context = parent.get_span_context() if parent is not None else None
            self._parent = parent_context
            return parent_context
        raise AttributeError(name)

    @property
    def _resource(self) -> Any:  # type: ignore[override]
        return self._state.resource

    @property
    def _instrumentation_scope(self) -> Any:  # type: ignore[override]
        return self._state.scope

    # -- ReadableSpan ---------------------------------------------------------
    @property
    def attributes(self) -> Mapping[str, Any]:
        return MappingProxyType(self._attributes)

    @property
    def events(self) -> tuple[Any, ...]:
        return tuple(self._events)

    @property
    def dropped_events(self) -> int:
        return self._dropped_events

    @property
    def dropped_attributes(self) -> int:
        return 0

    @property
    def dropped_links(self) -> int:
        return 0

    # -- Span -----------------------------------------------------------------
    def get_span_context(self) -> trace_api.SpanContext:
        return self._context  # type: ignore[no-any-return]

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end_time is not None:
            return
        cleaned = _clean_attribute(key, value, self._state.max_value_length)
        if cleaned is not None:
            self._attributes[key] = cleaned

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def set_mark_attribute(self, key: str, value: Any) -> None:
        """``set_attribute`` for a value ``ci.mark`` already validated."""
        if self._end_time is None:
            if type(value) is str and len(value) > self._state.max_value_length:
                value = value[: self._state.max_value_length]
            self._attributes[key] = value

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self._end_time is not None:
            return
        cleaned: dict[str, Any] = {}
        for key, value in (attributes or {}).items():
            value = _clean_attribute(key, value, self._state.max_value_length)
            if value is not None:
                cleaned[key] = value
        self.add_mark_event(name, cleaned, timestamp if timestamp is not None else _time_ns())

    def add_mark_event(self, name: str, attributes: dict[str, Any], timestamp: int) -> bool:
        """Append a pre-validated event; returns False when an older one was dropped."""
        if self._end_time is not None:
            return True
        events = self._events
        if type(events) is tuple:  # the first event: a list (a deque costs ~700 bytes)
            events = self._events = []
        elif len(events) >= self._state.max_events and type(events) is list:
            # At the limit: keep the newest, dropping the oldest from here on.
            events = self._events = collections.deque(events, maxlen=self._state.max_events)
        full = len(events) >= self._state.max_events
        events.append(MarkEvent(name, attributes, timestamp))
        if full:
            self._dropped_events += 1
        return not full

    def add_link(
        self, context: trace_api.SpanContext | None, attributes: Mapping[str, Any] | None = None
    ) -> None:
        if self._end_time is None and context is not None and context.is_valid:
            self._links = self._links + (trace_api.Link(context, attributes),)

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end_time is not None:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is StatusCode.UNSET or self._status.status_code is StatusCode.OK:
            return
        self._status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: Any = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        exception_type = type(exception)
        module = exception_type.__module__
        qualified = exception_type.__qualname__
        details = {
            semconv.EXCEPTION_TYPE: f"{module}.{qualified}"
            if module and module != "builtins"
            else qualified,
            semconv.EXCEPTION_MESSAGE: str(exception),
            semconv.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exception)),
            semconv.EXCEPTION_ESCAPED: str(escaped),
        }
        if attributes:
            details.update(attributes)
        self.add_event(semconv.EXCEPTION, details, timestamp)

    def end(self, end_time: int | None = None) -> None:
        # Lock-free "end once", so a signal handler never finds a span's end
        # stuck behind a held lock. Between the test and the store below there
        # is no call and no backward jump, the only places CPython switches
        # threads or runs a signal handler, so of two threads ending one span
        # exactly one wins. (dict.setdefault on __dict__ did the same, but made
        # CPython build a real dict for every span: ~0.2 us, ~1.4 us cold.)
        stamp = end_time if end_time is not None else _time_ns()
        if self._end_time is not None:
            return
        self._end_time = stamp
        for processor in self._state.processors._span_processors:
            processor.on_end(self)

    # -- attributes resolved after the span ended (GPU time) --------------------
    def defer_attribute(self, key: str, resolve: Any, target: Any = None) -> None:
        """Set ``key`` later, to what ``resolve(final)`` returns once it is not None.

        The processor asks before exporting the span (off the training thread)
        and holds the span back a little while ``resolve(False)`` says None;
        ``resolve(True)`` (at flush and shutdown) may wait for the answer.
        ``target``: the attributes of one of its events (a mark's value), not
        the span's own; it holds a placeholder until then.
        """
        if self._deferred is None:
            self._deferred = []
        self._deferred.append((key, resolve, target))
        DEFERRED_SEEN[0] = True

    def resolve_deferred(self, final: bool = False) -> bool:
        """Fill in what is ready; True when nothing is left (``final``: give up on the rest)."""
        pending = []
        for key, resolve, target in self._deferred or ():
            attributes = self._attributes if target is None else target
            failed = False
            try:
                value = resolve(final)
            except Exception:  # noqa: BLE001 - a resolver that fails just leaves no attribute
                value, failed = None, True
            if value is not None:
                attributes[key] = value
            elif not final and not failed:
                pending.append((key, resolve, target))
            elif target is not None:
                target.pop(key, None)  # never a placeholder in what is exported
        self._deferred = pending or None
        return not pending

    def __repr__(self) -> str:
        return f"ScopeSpan(name={self._name!r}, span_id={self._span_id:016x})"


# -- OpenTelemetry's private names: reached from here only ---------------------------------
SPAN_KEY = _SPAN_KEY  # the key of the current span in an OTel Context


def span_ids(span: ReadableSpan) -> tuple[int, int | None]:
    """(span id, the parent's span id or None) of an ended span, without building its
    ``SpanContext``: a span of cirron's builds that on first use, and a reader that only needs
    the ids (the metrics sink, for every span) should not build one per span."""
    if type(span) is ScopeSpan:
        parent = span._parent_span
        if parent is None:
            return span._span_id, None
        if type(parent) is ScopeSpan:
            return span._span_id, parent._span_id
        return span._span_id, parent.get_span_context().span_id
    context, parent_context = span.get_span_context(), span.parent
    return (
        context.span_id if context is not None else 0,
        parent_context.span_id if parent_context is not None else None,
    )


def context_variable() -> Any:
    """The ``ContextVar`` behind OpenTelemetry's context, used directly on the hot path.

    ``get``/``set``/``reset`` on it are what ``context.get_current``/``attach``/
    ``detach`` do, without their layers. With a custom runtime context (an
    ``OTEL_PYTHON_CONTEXT`` of another kind) the public API is used instead.
    """
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    if isinstance(runtime, ContextVarsRuntimeContext) and hasattr(runtime, "_current_context"):
        return runtime._current_context
    return _PublicContext()


class _PublicContext:
    """The same three calls through the public API, for a custom runtime context."""

    def get(self) -> Any:
        return otel_context.get_current()

    def set(self, context: Any) -> Any:
        return otel_context.attach(context)

    def reset(self, token: Any) -> None:
        otel_context.detach(token)


def span_processors(provider: trace_api.TracerProvider) -> tuple[SpanProcessor, ...]:
    """The span processors of an SDK provider (the SDK has no public way to list them)."""
    multi = getattr(provider, "_active_span_processor", None)
    return tuple(getattr(multi, "_span_processors", ()))


def add_span_processor_first(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Add ``processor`` to ``provider`` ahead of the processors it has.

    cirron's processor hands the processors the hook spans it builds off the training
    thread: put first, a ``force_flush()`` or ``shutdown()`` of the user's own provider
    builds and hands them over before the user's batch processor flushes or shuts down
    (last, they missed it). The SDK only appends; without its tuple and lock, it stays last.
    """
    provider.add_span_processor(processor)
    multi: Any = getattr(provider, "_active_span_processor", None)
    lock = getattr(multi, "_lock", None)
    if lock is None or not isinstance(getattr(multi, "_span_processors", None), tuple):
        return
    with lock:
        others = tuple(p for p in multi._span_processors if p is not processor)
        multi._span_processors = (processor, *others)


def extend_resource(provider: TracerProvider, extra: Any) -> None:
    """Merge ``extra`` (a ``Resource``) into ``provider``'s, ``extra``'s values winning.

    For the provider ``opentelemetry-instrument``'s configurator built (zero-code): it knows
    nothing of ranks, runs and the script's name, and the SDK has no way to give a provider
    another resource once made. The resource object is changed in place (its attributes
    replaced, before any span of the run began), so that the tracers other instrumentations
    made from it already carry the same one: one process, one resource.
    """
    current = getattr(provider, "_resource", None)
    if current is None or not hasattr(current, "merge"):
        return
    merged = current.merge(extra)
    if hasattr(current, "_attributes"):
        current._attributes = merged._attributes
    else:  # another SDK's resource: new tracers only
        provider._resource = merged


def remove_span_processor(provider: trace_api.TracerProvider, processor: SpanProcessor) -> bool:
    """Detach ``processor`` from ``provider``; False when this SDK offers no way (it stays, inert)."""
    multi = getattr(provider, "_active_span_processor", None)
    lock = getattr(multi, "_lock", None)
    if multi is None or lock is None or not hasattr(multi, "_span_processors"):
        return False
    with lock:
        multi._span_processors = tuple(p for p in multi._span_processors if p is not processor)
    return True


def exporters_of(provider: trace_api.TracerProvider) -> list[SpanExporter]:
    """The exporters behind the provider's processors (batch and simple processors alike)."""
    return [e for processor in span_processors(provider) for e in exporters_of_processor(processor)]


def exporters_of_processor(processor: SpanProcessor) -> list[SpanExporter]:
    """The exporter(s) behind one processor (a batch or simple processor's); none for others."""
    found: list[SpanExporter] = []
    for holder in (processor, getattr(processor, "_batch_processor", None)):
        for attribute in ("span_exporter", "_exporter", "exporter"):
            exporter = getattr(holder, attribute, None)
            if exporter is not None and not any(exporter is seen for seen in found):
                found.append(exporter)  # a batch processor holds its exporter twice
    return found


def forget_global_provider() -> None:
    """Allow ``trace.set_tracer_provider`` again (it is set-once), as OTel's test utilities do.

    Only ever for a provider cirron made for an earlier ``ci.profile()``.
    """
    from opentelemetry.util._once import Once

    trace_api._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace_api._TRACER_PROVIDER = None  # type: ignore[attr-defined]


def ended_copy(span: trace_api.Span) -> ReadableSpan:
    """What an SDK span handed its processors when it ended (itself, for our lean spans)."""
    readable = getattr(span, "_readable_span", None)
    if readable is not None:
        return readable()  # type: ignore[no-any-return]
    return cast(ReadableSpan, span)


def span_lock(span: trace_api.Span) -> threading.Lock | None:
    """An SDK span's lock (None for ours, which need none)."""
    return getattr(span, "_lock", None)


def widen_event_limit(span: trace_api.Span, events: int) -> None:
    """Give an SDK span (a custom sampler's) room for ``events`` events."""
    from opentelemetry.sdk.util import BoundedList

    current = getattr(span, "_events", None)
    limit = getattr(getattr(current, "_dq", None), "maxlen", None)
    if isinstance(current, BoundedList) and limit is not None and limit < events:
        span._events = BoundedList(events)  # type: ignore[attr-defined]


@contextmanager
def untraced() -> Iterator[None]:
    """Run cirron's own exports inside OpenTelemetry's suppress-instrumentation context.

    With ``requests``, ``urllib3`` or ``grpc`` instrumented in the program, each
    export would otherwise be a span of the user's trace (exported by the next
    export, and so on). The SDK's own processors set the same key; the plain
    ``"suppress_instrumentation"`` key is the one older instrumentations read.
    (``opentelemetry.instrumentation.utils.suppress_instrumentation`` does the
    same, but importing it adds 30 ms to ``import cirron``.)
    """
    context = otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True)
    context = otel_context.set_value("suppress_instrumentation", True, context)
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
