"""``ci.mark``: a value on the innermost open scope, on the hot path of every step.

A point mark is an event on the span (named after the mark, its ``value`` attribute); a
summary mark the span attribute ``mark.<name>``. A value no mark can hold is dropped with
one warning per name and counted (``ci.health()["marks_invalid"]``): a mark never stops
training. A value still on a device is read later (:class:`cirron.otel.values.Deferred`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span

from ..otel import semconv, values
from ..otel.spans import SPAN_KEY, MarkEvent, ScopeSpan, context_variable
from . import hot, recorder, training_state
from .recorder import Recorder

MARK_KINDS = ("point", "summary")
_time_ns = time.time_ns
_completed = training_state.completed  # [span of a completed step whose loop may be left, loop]
_hooks = training_state.hooks
_open_hook_spans = training_state.open_hook_spans  # noted hook spans (cirron.recording.hook_spans)
_pending_fetches = training_state.pending_fetches  # batch fetches whose step is not known yet
_context_var = context_variable()  # the OTel context, without the API's layers


def mark(name: Any, value: Any, kind: str = "point", **attributes: Any) -> None:
    """Record a value on the innermost open scope (``cirron.session`` if none).

    ``kind="point"`` (default) adds a span event named ``name`` with attribute
    ``value`` (a time series: loss per step). ``kind="summary"`` sets the span
    attribute ``mark.<name>`` (one final value, e.g. epoch accuracy). Values
    are int, float (NaN and inf included), bool, str, or a one-element
    numpy/torch value (``loss``, ``loss.view(1)``); one on a GPU is read after
    the device got there, never waiting for it here. Any other value is
    dropped with one warning per mark name and counted in
    ``ci.health()["marks_invalid"]``: a mark never stops training. A bad name
    or kind is an error.
    """
    if type(name) is not str or not name:
        values.name(name, "mark name")
    if type(value) is not float:
        value = _mark_value(name, value)
        if value is _INVALID:
            if kind not in MARK_KINDS:
                raise ValueError(f"mark kind must be one of {MARK_KINDS}, got {kind!r}")
            return
    rec = recorder.current or recorder.active()
    if not rec.enabled:
        if kind not in MARK_KINDS:
            raise ValueError(f"mark kind must be one of {MARK_KINDS}, got {kind!r}")
        return
    if _pending_fetches:
        _hooks.settle_fetches()
    if _open_hook_spans:
        _hooks.build_hook_spans()
    span = _context_var.get().get(SPAN_KEY)
    if span is _completed[0] and span is not None:
        _hooks.loop_check()  # a mark after the training loop is not its step's
        span = _context_var.get().get(SPAN_KEY)
    if type(span) is ScopeSpan and span._end_time is None:
        if kind == "point" and not attributes and type(value) is not values.Deferred:
            # the common case, inline
            if not span.add_mark_event(name, {semconv.MARK_VALUE: value}, _time_ns()):
                _mark_dropped(rec, span)
            return
    elif span is None or not span.is_recording():
        span = rec.session
    _record_mark(rec, span, name, value, kind, attributes)


def mark_on(span: Span, name: str, value: Any, kind: str = "point") -> None:
    """A mark on ``span`` rather than the innermost scope: for hooks that know which span a
    value describes (a framework's logged metrics). Validated like :func:`mark`."""
    if type(name) is not str or not name:
        values.name(name, "mark name")
    if type(value) is not float:
        value = _mark_value(name, value)
        if value is _INVALID:
            return
    rec = recorder.current or recorder.active()
    if rec.enabled:
        _record_mark(rec, span, name, value, kind, {})


def marks_from(span: Span, logged: Mapping[Any, Any], kind: str) -> None:
    """One mark on ``span`` per value a framework logged, its own value (``kind``: point/summary).

    A value that is not a number or a string (an array, a dict) is left out.
    """
    if span is None:
        return
    rec = recorder.current or recorder.active()
    if not rec.enabled:
        return
    # Once per batch in a framework's loop: floats with plain names (what Keras and
    # Lightning log) go straight onto one of our spans, all stamped with one time.
    lean = kind == "point" and type(span) is ScopeSpan
    now = _time_ns() if lean else 0
    for name, value in logged.items():
        if lean and type(value) is float and type(name) is str and name:
            if not span.add_mark_event(name, {semconv.MARK_VALUE: value}, now):  # type: ignore[attr-defined]
                _mark_dropped(rec, span)
            continue
        try:
            mark_on(span, str(name), value, kind)
        except (TypeError, ValueError):
            continue


_INVALID = object()  # what _mark_value gives for a value no mark can hold


def _mark_value(name: str, value: Any) -> Any:
    """The value a mark records, or ``_INVALID`` (warned about once per name, and counted)."""
    try:
        value = values.mark_value(value, f"mark {name!r} value")
    except (TypeError, ValueError) as error:
        rec = recorder.current or recorder.active()
        rec.health.add("marks_invalid")
        rec.health.warn_once(
            f"mark-value-{name}",
            "cirron: %s; the mark is dropped (training goes on; counted in "
            "ci.health()['marks_invalid'])",
            error,
        )
        return _INVALID
    if type(value) is str and len(value) > recorder.MAX_VALUE_LENGTH:
        value = value[: recorder.MAX_VALUE_LENGTH]
    return value


def _record_mark(
    rec: Recorder, span: Span, name: str, value: Any, kind: str, attributes: dict[str, Any]
) -> None:
    if span is None or not span.is_recording():
        rec.health.add("marks_dropped")
        return
    deferred = value if type(value) is values.Deferred else None
    if deferred is not None and type(span) is not ScopeSpan:
        value = deferred.resolve(True)  # an SDK span can't wait: read now
        if value is None:
            return
        deferred = None
    if kind == "point":
        event_attributes = {semconv.MARK_VALUE: value}
        if attributes:
            event_attributes.update(values.attributes(attributes, f"mark {name!r}"))
        if type(span) is ScopeSpan:
            kept = span.add_mark_event(name, event_attributes, _time_ns())
            if deferred is not None:
                span.defer_attribute(semconv.MARK_VALUE, deferred.resolve, event_attributes)
        else:
            dropped = getattr(span, "dropped_events", 0)
            span.add_event(name, event_attributes)
            kept = getattr(span, "dropped_events", 0) == dropped
        if not kept:
            _mark_dropped(rec, span)
    elif kind == "summary":
        if deferred is not None:  # (only ScopeSpans are left with a deferred value)
            span.defer_attribute(semconv.MARK_PREFIX + name, deferred.resolve)  # type: ignore[attr-defined]
        elif type(span) is ScopeSpan:
            span.set_mark_attribute(semconv.MARK_PREFIX + name, value)
        else:
            span.set_attribute(semconv.MARK_PREFIX + name, value)
    else:
        raise ValueError(f"mark kind must be one of {MARK_KINDS}, got {kind!r}")


def _mark_dropped(rec: Recorder, span: Span) -> None:
    rec.health.add("marks_dropped")
    rec.health.warn_once(
        "mark-limit",
        "cirron: span %r reached its event limit; older marks are dropped "
        "(counted in ci.health()['marks_dropped'])",
        getattr(span, "name", "?"),
    )


# The pure-Python mark is the reference. Where the compiled helper is built, ``ci.mark`` is its
# twin: the common case (a float under a name, on an open scope or step) with no Python frame,
# everything else handed to the pure ``mark`` above, which checks it all again.
PURE_MARK = mark
if hot.compiled is not None:
    # (the rest it works with, the recorder, the training state's lists, the OTel context:
    # hot.py's configure)
    mark = hot.compiled.Mark(pure=PURE_MARK, event=MarkEvent, value_key=semconv.MARK_VALUE)  # noqa: F811
