"""The one-line text form of a span, shared by the stdout/log sinks and ``ci.trace()``.

``epoch[0] - 142us {epoch_loss=0.5234, lr=0.001}``: the name, ``[index]`` when
the span has one, the duration with a unit (or ``open``), then in braces the
summary marks and the last value of each point mark; a span that ended in an
error says so last: ``epoch[1] - 2.1s ERROR ValueError: a bad batch``.
"""

from __future__ import annotations

import math
from typing import Any

from ..otel import semconv
from ..otel.health import printable

MARK_PREFIX = semconv.MARK_PREFIX
ERROR_WIDTH = 80  # characters of an error's type and message on a span's line, at most


def format_duration(nanoseconds: int | None) -> str:
    if nanoseconds is None:
        return "open"
    if nanoseconds < 1_000:
        return f"{nanoseconds}ns"
    for unit, scale in (("us", 1e3), ("ms", 1e6), ("s", 1e9)):
        value = nanoseconds / scale
        if round(value) < 1000 or unit == "s":
            return f"{value:.0f}{unit}" if value >= 100 else f"{value:.3g}{unit}"
    raise AssertionError("unreachable")


def format_value(value: Any) -> str:
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # nan, inf, -inf
        magnitude = abs(value)
        if magnitude != 0 and (magnitude < 1e-2 or magnitude >= 1e15):
            # Small and huge values keep their significant digits: 4e-05, 1.23e-07.
            return f"{value:.3g}"
        text = f"{value:.4f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(item) for item in value) + "]"
    return printable(str(value))


def is_point_mark(event: Any) -> bool:
    """A point mark is an event with a ``value`` (other events: snapshot tensors, exceptions)."""
    return semconv.MARK_VALUE in (event.attributes or {})


def point_marks(span: Any) -> list[tuple[str, Any, int]]:
    """``(name, value, time_ns)`` of each point mark."""
    return [
        (event.name, event.attributes[semconv.MARK_VALUE], event.timestamp)
        for event in span.events
        if is_point_mark(event)
    ]


def summary_marks(span: Any) -> list[tuple[str, Any]]:
    return [
        (key[len(MARK_PREFIX) :], value)
        for key, value in (span.attributes or {}).items()
        if key.startswith(MARK_PREFIX)
    ]


def mark_values(span: Any) -> dict[str, Any]:
    """Last value of each point mark, then the summary marks (which win)."""
    shown: dict[str, Any] = {}
    for name, value, _time in point_marks(span):
        shown[name] = value
    for name, value in summary_marks(span):
        shown[name] = value
    return shown


OPEN_RUNNING = "open (running)"
OPEN_STOPPED = "open (not ended: the process stopped)"


def span_line(span: Any, open_as: str = OPEN_RUNNING) -> str:
    """``name[index] - duration {marks}``; an open span says why it is open (``open_as``)."""
    attributes = span.attributes or {}
    text = printable(span.name)
    if semconv.INDEX in attributes:
        text += f"[{format_value(attributes[semconv.INDEX])}]"
    end = span.end_time
    text += " - " + (format_duration(end - span.start_time) if end is not None else open_as)
    marks = mark_values(span)
    if marks:
        text += (
            " {" + ", ".join(f"{printable(k)}={format_value(v)}" for k, v in marks.items()) + "}"
        )
    failure = error_of(span)
    if failure is not None:
        text += " ERROR" + (f" {failure}" if failure else "")
    return text


def error_of(span: Any) -> str | None:
    """What a span that ended in an error (status ERROR) raised, one line, shortened:
    ``ValueError: a bad batch`` ("" when it says nothing); None for any other span."""
    status = getattr(span, "status", None)
    if status is None or status.status_code.name != "ERROR":
        return None
    what = status.description or ""
    for event in span.events:
        if event.name == semconv.EXCEPTION:
            attributes = event.attributes or {}
            kind = str(attributes.get(semconv.EXCEPTION_TYPE, ""))
            message = str(attributes.get(semconv.EXCEPTION_MESSAGE, ""))
            what = f"{kind}: {message}" if kind and message else kind or message or what
            break
    what = printable(" ".join(what.split()))  # one line
    return what if len(what) <= ERROR_WIDTH else what[: ERROR_WIDTH - 3] + "..."
