"""``ci.scope`` and the helpers that open and close spans: the hot path (``ci.mark``: marks).

A scope is an SDK span that is the current span in the OpenTelemetry context
while it is open, so spans from any other OTel instrumentation nest under it.
A scope with no recording parent in its context becomes a child of
``cirron.session`` (also in other threads). Nesting depth is kept in the
same OTel context, so it is per thread / async task; past ``MAX_SCOPE_DEPTH``
a scope runs the user's code but records nothing.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.context import create_key
from opentelemetry.context.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from ..config import MAX_SCOPE_DEPTH
from ..otel import ids, semconv, values
from ..otel.processor import RingBufferSpanProcessor
from ..otel.spans import SPAN_KEY, ScopeSpan, context_variable
from . import hot, recorder, training_state
from .recorder import Recorder

# On the root span of a trace a long run split off: the span id of its parent in the run's tree.
PARENT_ATTRIBUTE = semconv.PARENT_SPAN_ID

# Scopes recorded around the current point, kept in the OTel context beside the span.
_DEPTH_KEY = create_key("cirron-scope-depth")
_time_ns = time.time_ns
_enclosing = training_state.enclosing  # spans an epoch or step opened inside (mutated in place)
_completed = training_state.completed  # [span of a completed step whose loop may be left, loop]
_hooks = training_state.hooks
_open_hook_spans = training_state.open_hook_spans  # noted hook spans (cirron.recording.hook_spans)
_pending_fetches = training_state.pending_fetches  # batch fetches whose step is not known yet


_context_var = context_variable()  # the OTel context, without the API's layers


def _lean_trace_id(parent: Span) -> int | None:
    """The trace id for a lean child of ``parent`` (an SDK or foreign span), or None when the
    SDK must decide."""
    context = parent.get_span_context()
    return context.trace_id if context.trace_flags.sampled else None  # type: ignore[no-any-return]


class Scope:
    """An open (or about to open) region; see :func:`scope`."""

    __slots__ = (
        "name",
        "attributes",
        "span",
        "start_ns",
        "_opened",
    )

    def __init__(self, name: str, attributes: dict[str, Any], start_ns: int | None = None) -> None:
        self.name = name
        self.attributes = attributes
        self.span: Span | None = None
        self.start_ns = start_ns  # backdate the span (hooks that learn of a region late)

    def __enter__(self) -> Scope:
        rec = recorder.current or recorder.active()
        if not rec.enabled:
            self.span = None
            return self
        if _pending_fetches:  # right after a batch fetch: its step opens first, around this
            _hooks.settle_fetches()
        if _open_hook_spans:  # inside a hook's call (a forward): its span is built first
            _hooks.build_hook_spans()
        previous = _context_var.get()
        depth = previous.get(_DEPTH_KEY, 0)  # recorded scopes around this one, here
        if depth >= MAX_SCOPE_DEPTH:
            self.span = None
            rec.health.add("scopes_too_deep")
            rec.health.warn_once(
                "scope-depth",
                "cirron: scopes nested deeper than %d are not recorded (first: %r); "
                "the code inside still runs",
                MAX_SCOPE_DEPTH,
                self.name,
            )
            return self
        parent = previous.get(SPAN_KEY)
        if _completed[0] is not None and parent is _completed[0]:
            _hooks.loop_check()  # a scope after the training loop is not in its step
            previous = _context_var.get()
            parent = previous.get(SPAN_KEY)
        # open_on, inline (this is the hot path), with the depth in the same context; and
        # _start_span's common cases, inline: inside one of our open spans (a step, a
        # scope), or at the top level, under cirron.session
        parent_context = previous
        if parent is None:
            parent, parent_context = rec.session, rec.session_context
        lean = rec.lean
        if type(parent) is ScopeSpan and parent._end_time is None and lean is not None:
            span = ScopeSpan(
                self.name, parent._trace_id, parent, {**self.attributes}, lean, parent_context,
                self.start_ns,
            )  # fmt: skip
        else:
            span = _start_span(rec, self.name, {**self.attributes}, self.start_ns, previous)
        context = Context({**previous, SPAN_KEY: span, _DEPTH_KEY: depth + 1})
        self._opened = (span, _context_var.set(context), previous)
        self.span = span
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        span = self.span
        if span is None:
            return
        self.span = None
        if span in _enclosing:  # an epoch or step the hooks opened inside ends with it
            _hooks.enclosing_end(span)
        if exc is not None:
            close_span(self._opened, exc)
            return
        # close_span's common case, inline: ended where it began, on top of the context
        opened = self._opened
        span.end()
        if _context_var.get().get(SPAN_KEY) is span:
            try:
                _context_var.reset(opened[1])
                return
            except (ValueError, RuntimeError):  # another context (a generator moved)
                pass
        _restore(span, opened)

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Use the scope as a decorator: one span per call of ``function``."""
        name, attributes = self.name, self.attributes
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with Scope(name, attributes):
                    return await function(*args, **kwargs)

            return run_async

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with Scope(name, attributes):
                return function(*args, **kwargs)

        return run

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the open span (ignored when not recording)."""
        value = values.attribute(value, f"scope {self.name!r} attribute {key!r}")
        if self.span is not None:
            self.span.set_attribute(key, value)


class _NoScope:
    """What ``ci.scope`` returns when profiling is disabled: does nothing."""

    __slots__ = ()
    span = None

    def __enter__(self) -> _NoScope:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return function

    def set_attribute(self, key: str, value: Any) -> None:
        return None


NO_SCOPE = _NoScope()


def close_with_error(span: Span, error: BaseException | str) -> None:
    """Record ``error`` on ``span`` and set status ERROR (the span stays open)."""
    if isinstance(error, BaseException):
        span.record_exception(error)
        description = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            # Raised by a signal's handler: name the signal (SIGINT, SIGTERM).
            rec = recorder.current
            received = rec.signal if rec is not None else None
            if received:
                description = f"{received}: {description}"
    else:
        description = error
    # An exception's text can be anything (a 10 MB input): cut like any value.
    span.set_status(Status(StatusCode.ERROR, description[: values.MAX_VALUE_LENGTH]))


def _start_span(
    rec: Recorder, name: str, attributes: dict[str, Any], start_ns: int | None, context: Any
) -> Any:
    """A span under the open span of ``context`` (or ``cirron.session``), lean when possible."""
    parent = context.get(SPAN_KEY)
    lean = rec.lean
    # The common case first: inside one of our open spans (an epoch, a step).
    if type(parent) is ScopeSpan and parent._end_time is None and lean is not None:
        return ScopeSpan(name, parent._trace_id, parent, attributes, lean, context, start_ns)
    parent_context = context
    if parent is None or not parent.is_recording():
        parent = rec.session  # None on a provider-bound recorder: a root span
        parent_context = rec.session_context
    if lean is not None:
        trace_id: int | None
        if type(parent) is ScopeSpan:  # cirron.session, as usual at the top level
            trace_id = parent._trace_id
        else:
            trace_id = lean.new_trace_id() if parent is None else _lean_trace_id(parent)
        if trace_id is not None:
            return ScopeSpan(name, trace_id, parent, attributes, lean, parent_context, start_ns)
    # a custom sampler or an unsampled foreign parent: the SDK decides
    return rec.tracer.start_span(
        name, context=parent_context or Context(), attributes=attributes, start_time=start_ns
    )


def open_on(
    rec: Recorder,
    name: str,
    attributes: dict[str, Any],
    start_ns: int | None,
    parent: Any = None,
) -> tuple[Any, Any, Any]:
    """Start a span on recorder ``rec`` and make it current; returns what :func:`close_span` needs.

    ``parent``: an open span to start it under instead of the current one (which is current
    again once it ends).
    """
    if _open_hook_spans:
        _hooks.build_hook_spans()
    previous = _context_var.get()
    context = previous if parent is None else Context({**previous, SPAN_KEY: parent})
    span = _start_span(rec, name, attributes, start_ns, context)
    return span, _context_var.set(Context({**context, SPAN_KEY: span})), previous


def open_root(
    rec: Recorder,
    name: str,
    attributes: dict[str, Any],
    trace_id: int,
    logical_parent: Any,
    start_ns: int | None = None,
) -> tuple[Any, Any, Any]:
    """Like :func:`open_on`, but the span begins trace ``trace_id`` (a long run's epoch).

    It stays tied to ``logical_parent``, the span it would have been a child
    of: by a link, and by the attribute ``cirron.parent_span_id``, which
    ``ci.trace()`` follows to show one tree.
    """
    previous = _context_var.get()
    parent_context = logical_parent.get_span_context()
    attributes = {**attributes, PARENT_ATTRIBUTE: format(parent_context.span_id, "016x")}
    if rec.lean is not None:
        span: Span = ScopeSpan(name, trace_id, None, attributes, rec.lean, Context(), start_ns)
        span.add_link(parent_context)
    else:  # the SDK takes a trace id only from a parent: a remote one, never recorded
        root = NonRecordingSpan(SpanContext(trace_id, parent_context.span_id, True, TraceFlags(1)))
        span = rec.tracer.start_span(
            name,
            context=set_span_in_context(root, Context()),
            attributes=attributes,
            links=[Link(parent_context)],
            start_time=start_ns,
        )
    return span, _context_var.set(Context({**previous, SPAN_KEY: span})), previous


def open_span(
    name: str, attributes: dict[str, Any], start_ns: int | None = None
) -> tuple[Any, Any, Any] | None:
    """``Scope.__enter__`` without the Scope object, for hooks; None when not recording.

    Hook spans don't count toward the nesting limit: hooks add a fixed few levels.
    """
    rec = recorder.current
    if rec is None or not rec.enabled:
        return None
    return open_on(rec, name, attributes, start_ns)


def close_span(
    opened: tuple[Any, Any, Any], error: BaseException | None = None, end_ns: int | None = None
) -> None:
    """End a span from :func:`open_on` and restore the context it replaced.

    ``end_ns``: when it ended, if earlier than now (a step ends where the next one's fetch began).
    """
    span = opened[0]
    if error is not None and span.is_recording():
        close_with_error(span, error)
    span.end(end_ns)
    _restore(span, opened)


def _restore(span: Any, opened: tuple[Any, Any, Any]) -> None:
    """Put back the context ``span`` (now ended) replaced when :func:`open_on` made it current."""
    _span, token, previous = opened
    on_top = _context_var.get().get(SPAN_KEY) is span
    # Closed out of order, the token restores what this span replaced, unless that was a
    # span that has ended since (one of another tracer's, that this one opened inside of):
    # bringing it back would leave an ended span current. Then the context stays.
    if not on_top and getattr(previous.get(SPAN_KEY), "end_time", None) is not None:
        return
    try:
        _context_var.reset(token)
    except (ValueError, RuntimeError):  # another context (a generator moved), or reset twice
        if on_top:  # never another thread's context
            _context_var.set(previous)


def current_span() -> Any:
    """The current span of this thread/task in the OTel context (None if there is none)."""
    if _open_hook_spans:
        _hooks.build_hook_spans()
    return _context_var.get().get(SPAN_KEY)


def scope(name: Any, index: int | None = None, **attributes: Any) -> Any:
    """Open a named region of your program as a span.

    Use it as a context manager (``with ci.scope("augment"): ...``) or as a
    decorator (``@ci.scope("eval")`` or bare ``@ci.scope``). ``index`` and any
    keyword attributes are recorded on the span. Scopes nest under whatever
    scope is open in this thread or async task, up to 64 deep. An exception
    inside marks the span as failed (status ERROR) and propagates unchanged.
    """
    rec = recorder.current
    if rec is not None and not rec.enabled:
        return NO_SCOPE if not callable(name) else name
    if callable(name) and not isinstance(name, str):  # bare @ci.scope
        return Scope(getattr(name, "__qualname__", repr(name)), {})(name)
    if type(name) is not str or not name:
        values.name(name, "scope name")
    if attributes:
        attributes = values.attributes(attributes, f"scope {name!r}")
    if index is not None:
        attributes[semconv.INDEX] = values.index(index)
    return Scope(name, attributes)


# The pure-Python twins are the reference (tests compare the compiled ones with them). Where
# the compiled helper is built, ``ci.scope``, a scope's enter and exit, ``open_on`` and
# ``close_span`` and the span processor's ``on_start``/``on_end`` run its twins: the common
# case (a named scope or a step's span, inside an open lean span or at the top level, ended
# without an error) with no Python frame, all else handed to the functions kept here.
PURE_TWINS = {
    "scope": scope,
    "__enter__": Scope.__enter__,
    "__exit__": Scope.__exit__,
    "open_on": open_on,
    "close_span": close_span,
    "on_start": RingBufferSpanProcessor.on_start,
    "on_end": RingBufferSpanProcessor.on_end,
}
if hot.compiled is not None:
    hot.compiled.configure_scopes(  # (the rest it works with: hot.py's configure)
        enclosing=_enclosing,
        depth_key=_DEPTH_KEY,
        context=Context,
        restore=_restore,
        scope=Scope,
        random_bits=ids.random_bits,
        open_on=open_on,
        close_span=close_span,
        max_depth=MAX_SCOPE_DEPTH,
    )
    open_on, close_span = hot.compiled.open_on, hot.compiled.close_span  # noqa: F811
    Scope.__enter__ = hot.compiled.Twin(1, PURE_TWINS["__enter__"])  # type: ignore[method-assign]
    Scope.__exit__ = hot.compiled.Twin(2, PURE_TWINS["__exit__"])  # type: ignore[method-assign]
    scope = hot.compiled.Twin(0, PURE_TWINS["scope"])  # noqa: F811
    # Every span of cirron's starts and ends through the processor, on the training thread.
    RingBufferSpanProcessor.on_start = hot.compiled.Twin(3, PURE_TWINS["on_start"])  # type: ignore[method-assign]
    RingBufferSpanProcessor.on_end = hot.compiled.Twin(4, PURE_TWINS["on_end"])  # type: ignore[method-assign]
