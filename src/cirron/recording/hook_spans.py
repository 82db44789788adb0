"""Hook spans: the spans a framework hook puts around a call, built whole when it ends.

A hook around a forward, a backward or an optimizer step knows the span's
start when the call begins, but nothing inside the call needs the span object
unless something nests under it. So :func:`begin` only notes the start time
and the parent, and :func:`end` builds the finished span in one go: the same
span (name, attributes, parent, start and end times, error status and event)
handed to the span processors as if it had been open all along, without two
changes of the OpenTelemetry context per call. A hook that learns of a region
only once it is over (a DataLoader fetch) uses :func:`record`.

**Built on demand.** A ``ci.scope``, ``ci.mark`` or any span of cirron's
opened inside the call, on the same thread, finds the lazy span in
:data:`cirron.recording.training_state.open_hook_spans` and has it built and made
current first (:func:`build_here`), so it lands inside, as it always did. A
span of another OpenTelemetry instrumentation started inside the call does not
ask: its parent is the span around the call (the ``step``).

**Off the training thread.** Under ``ci.profile()`` an ended hook span is
only noted in the processor's queue; its flush thread builds the span
(:meth:`cirron.otel.processor.RingBufferSpanProcessor.build_noted`), and every
flush, ``ci.trace()``, ``ci.health()`` and shutdown builds what is left
first. Without a flush thread (instrumentors on your own provider) it is
built at once.

**Exits.** On a signal, at an uncaught exception and at shutdown the profiler
calls :func:`build_open` before it ends the open spans: a call still running
then gets its span, ended with the others (status ERROR on a signal).

A hook span whose parent is not one of cirron's lean spans (a custom sampler,
a foreign parent) is opened the usual way at :func:`begin`.

**Compiled.** Where cirron's C extension is built (:mod:`cirron.recording.hot`),
:func:`begin`, :func:`end` and :func:`_finished` are its twins of the functions
below: the same steps, without a Python frame, for the few spans every step
makes. What is not the common path (a parent that is not a lean span, a call
that raised, a span built while its call ran) they hand to the functions here.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from opentelemetry.context.context import Context
from opentelemetry.trace import set_span_in_context

from ..otel.processor import NOTED_WAKE_AT
from ..otel.spans import SPAN_KEY, ScopeSpan, context_variable
from . import hot, recorder, training_state
from .scopes import close_span, close_with_error, open_on

_context_var = context_variable()
_time_ns = time.time_ns
_thread_id = threading.get_ident
_open = training_state.open_hook_spans  # mutated in place, never rebound


class HookSpan:
    """A hook span from :func:`begin` to :func:`end`: noted, and built only when needed."""

    __slots__ = (
        "name",
        "attributes",
        "start_ns",
        "current",
        "parent",
        "context",
        "thread",
        "opened",
        "device_timer",
    )

    name: str
    attributes: dict[str, Any]
    start_ns: int
    current: Any  # the current span in the OTel context at begin (None: nothing current)
    parent: Any  # the lean span it is a child of; None once its span is built
    context: Any  # the OTel context at begin: what the processors' on_start gets
    thread: int
    opened: tuple[Any, Any, Any] | None  # once built while open: what close_span needs
    # Set by the hook right after begin when the call runs on a device (CUDA): called at
    # the end, it returns ``(key, resolve)``, an attribute known later (see defer_attribute).
    device_timer: Any


def begin(name: str, attributes: dict[str, Any]) -> HookSpan | None:
    """Note the start of hook span ``name`` under the current span.

    None when nothing is recorded: profiling is off, or the step is one that
    ``step_sampling`` keeps without its hook spans.
    """
    rec = recorder.current
    if rec is None or not rec.enabled or not rec.training.detail:
        return None
    if _open:  # a hook call inside another (an optimizer's closure): the outer one is built
        build_here()
    hook = HookSpan()
    hook.name, hook.attributes, hook.device_timer = name, attributes, None
    context = _context_var.get()
    current = parent = context.get(SPAN_KEY)
    if parent is None:  # at the top level: under cirron.session, as every span is
        parent, context = rec.session, rec.session_context
    hook.current, hook.context = current, context
    if type(parent) is ScopeSpan and parent._end_time is None and rec.lean is not None:
        hook.parent, hook.opened, hook.thread = parent, None, _thread_id()
        hook.start_ns = _time_ns()
        _open.append(hook)
    else:  # the SDK decides (a sampler, a foreign parent): a real span from the start
        hook.parent, hook.opened = None, open_on(rec, name, attributes, None)
    return hook


def end(hook: HookSpan, error: BaseException | None = None) -> None:
    """The call is over: its span is built (on the flush thread), or the one built on demand ends."""
    deferred = hook.device_timer() if hook.device_timer is not None else None
    end_ns = _time_ns()
    parent = hook.parent
    if hook.opened is None and error is None:
        hook.parent = None  # built from here on: build_open must not build it again
        try:  # _unlist, inline: this runs for every hook span
            _open.remove(hook)
        except ValueError:  # another thread's build_open took it off
            pass
        if hook.opened is None:  # (if build_open ran meanwhile, it gave it a span)
            _finished(
                hook.name, parent, hook.attributes, hook.context, hook.start_ns, end_ns, deferred
            )
            return
    _end_built(hook, parent, error, deferred, end_ns)


def _end_built(
    hook: HookSpan, parent: Any, error: BaseException | None, deferred: Any, end_ns: int
) -> None:
    """The rarer ends: a call that raised, or one whose span was built while it ran."""
    opened = hook.opened
    if opened is None:  # it raised: built here, with the error
        _unlist(hook)
        span = _build(hook)
        hook.parent = None
        if deferred is not None:
            span.defer_attribute(*deferred)
        close_with_error(span, error)  # type: ignore[arg-type]
        span.end(end_ns)
        return
    span = opened[0]
    if deferred is not None:
        defer = getattr(span, "defer_attribute", None)
        if defer is not None:
            defer(*deferred)
    if opened[1] is None:  # built by an exit path: not current anywhere
        if error is not None and span.is_recording():
            close_with_error(span, error)
        span.end()
        return
    close_span(opened, error)


def record(name: str, attributes: dict[str, Any], start_ns: int) -> None:
    """A hook span that already happened, from ``start_ns`` to now, under the current span."""
    rec = recorder.current or recorder.active()
    if not rec.enabled or not rec.training.detail:
        return
    if _open:
        build_here()
    current = _context_var.get().get(SPAN_KEY)
    if type(current) is ScopeSpan and current._end_time is None and rec.lean is not None:
        # No context: nothing can start inside a span that is already over.
        _finished(name, current, attributes, None, start_ns, _time_ns(), None)
        return
    close_span(open_on(rec, name, attributes, start_ns))


def record_on(
    parent: Any,
    name: str,
    attributes: dict[str, Any],
    start_ns: int,
    end_ns: int,
    error: BaseException | None = None,
) -> None:
    """A hook span that happened from ``start_ns`` to ``end_ns``, under ``parent`` (None:
    ``cirron.session``); ``error``: what the call raised (status ERROR, its exception event).

    For a region whose place in the tree is known only after it ended: a batch
    fetch, once the step it fed is known.
    """
    rec = recorder.current or recorder.active()
    if not rec.enabled:
        return
    if parent is None:
        parent = rec.session
    if type(parent) is ScopeSpan and rec.lean is not None:
        if error is None:
            _finished(name, parent, attributes, None, start_ns, end_ns, None)
            return
        span: Any = ScopeSpan(
            name, parent._trace_id, parent, attributes, parent._state, None, start_ns
        )
    else:  # an SDK span (a custom sampler), or no session (a provider of the user's)
        context = set_span_in_context(parent, Context()) if parent is not None else Context()
        span = rec.tracer.start_span(
            name, context=context, attributes=attributes, start_time=start_ns
        )
    if error is not None:
        close_with_error(span, error)
    span.end(end_ns)


def _finished(
    name: str,
    parent: ScopeSpan,
    attributes: dict[str, Any],
    context: Any,
    start_ns: int,
    end_ns: int,
    deferred: Any,
) -> None:
    """A hook span that ended: to the flush thread to build, or built here when there is none."""
    rec = recorder.current
    processor = rec.processor if rec is not None else None
    noted = processor.noted if processor is not None else None
    if noted is None:
        ScopeSpan.finished(name, parent, attributes, context, start_ns, end_ns, deferred)
        return
    noted.append((name, parent, attributes, context, start_ns, end_ns, deferred))
    # Once every NOTED_WAKE_AT, not at each one past it: while the flush thread waits for the
    # interpreter (a busy machine), every hook span would wake it again, taking its lock.
    if len(noted) % NOTED_WAKE_AT == 0:
        processor.noted_many()  # type: ignore[union-attr]


def _build(hook: HookSpan) -> Any:
    """The span of a noted hook span, started at its begin time, not made current."""
    parent = hook.parent
    return ScopeSpan(
        hook.name,
        parent._trace_id,
        parent,
        hook.attributes,
        parent._state,
        hook.context,
        hook.start_ns,
    )


def build_here() -> None:
    """Something is about to nest under the open hook spans of this thread: build them.

    Outermost first, each made current, so that what comes next nests inside
    the innermost. One that something else has been made current over since
    it began (another instrumentation's span) stays lazy: its children are
    that span's.
    """
    me = _thread_id()
    for hook in list(_open):
        if hook.thread != me or hook.opened is not None or hook.parent is None:
            continue
        context = _context_var.get()
        if context.get(SPAN_KEY) is not hook.current:
            continue
        span = _build(hook)
        hook.opened = (span, _context_var.set(Context({**context, SPAN_KEY: span})), context)
        _unlist(hook)


def build_open() -> None:
    """Every hook span still open, in any thread, gets its span now (exits and signals).

    The spans are open and not current anywhere; the exit path ends them
    with the other open spans.
    """
    for hook in list(_open):
        if hook.opened is None and hook.parent is not None:
            hook.opened = (_build(hook), None, None)
        _unlist(hook)


def _unlist(hook: HookSpan) -> None:
    """No longer open and lazy (another thread may have taken it off already)."""
    try:
        _open.remove(hook)
    except ValueError:
        pass


def _forget_in_child() -> None:
    """A forked child runs none of its parent's calls (its processor records nothing)."""
    _open.clear()


# The pure-Python twins, the reference (tests compare the compiled ones with them).
PURE_TWINS = {"begin": begin, "end": end, "_finished": _finished}
if hot.compiled is not None:  # the compiled twins, handed what they work with
    hot.compiled.configure_hook_spans(  # (the rest it works with: hot.py's configure)
        build_here=build_here,
        open_on=open_on,
        end_built=_end_built,
        end_pure=end,  # a hook span of the pure twin's (a test that mixes them)
        finished_now=ScopeSpan.finished,
        wake_at=NOTED_WAKE_AT,
    )
    begin, end, _finished = hot.compiled.begin, hot.compiled.end, hot.compiled.finished  # noqa: F811
training_state.hooks.build_hook_spans = build_here
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
