"""OTLP/JSON requests back to SDK spans, checked field by field: the spool's one decoder.

:class:`RequestDecoder` reads a request span by span and keeps what reads:

- A span must have a ``traceId`` of 32 and a ``spanId`` (and ``parentSpanId``, when it
  has one) of 16 hex digits, not all zeros; a ``name`` that is a string; a
  ``startTimeUnixNano`` (and ``endTimeUnixNano``, when it has one) in nanoseconds as an
  integer or its text; a ``kind``, ``flags`` and ``status`` of their types, when it has
  them; lists where lists belong. A span with anything else wrong is skipped.
- An attribute, event or link that is wrong (a key that is not a non-empty string, a value
  not of its type, a value nested more than :data:`MAX_VALUE_DEPTH` levels, a
  ``cirron.parent_span_id`` that is not a span id) is dropped, and its span kept.
- A ``resourceSpans`` or ``scopeSpans`` entry that is not an object, or whose ``resource``
  or ``scope`` is not, skips the spans in it; a bad attribute of a resource is dropped.

It notes the first problem and counts the rest, for one line about the request. Nothing
here recurses deeper than :data:`MAX_VALUE_DEPTH`. :func:`decode_request` is the strict
form, for one request known to be good. Reading spool *files* is
:mod:`cirron.exporters.spool_reader`'s.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from ..otel import semconv
from .otlp_json import REMOTE_PARENT

MAX_VALUE_DEPTH = 32  # arrays and maps in an attribute value, nested

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_HEX = {16: re.compile(r"[0-9a-fA-F]{16}"), 32: re.compile(r"[0-9a-fA-F]{32}")}
_INTEGER = re.compile(r"-?[0-9]{1,20}")
_NON_FINITE_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_KINDS = {f"SPAN_KIND_{kind.name}": kind.value + 1 for kind in SpanKind} | {
    "SPAN_KIND_UNSPECIFIED": 0
}  # OTLP counts from UNSPECIFIED = 0, the API from INTERNAL = 0
_SPAN_KINDS = (SpanKind.INTERNAL, *SpanKind)  # by OTLP's number: UNSPECIFIED read as INTERNAL
_STATUS_CODES = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_UNSET = Status(StatusCode.UNSET)
_STATUS_NAMES = {f"STATUS_CODE_{code.name}": number for number, code in _STATUS_CODES.items()}
# What a problem says was dropped, by the list it was dropped from.
_NOUNS = {"attributes": "attribute", "events": "event", "links": "link",
          "resource.attributes": "resource attribute"}  # fmt: skip


class _Bad(ValueError):
    """What is wrong with a span, an attribute, an event or a link: it says which field."""


# -- a request ------------------------------------------------------------------------------
def decode_request(request: Any) -> list[ReadableSpan]:
    """The spans of one OTLP/JSON ``ExportTraceServiceRequest`` as SDK ``ReadableSpan``s,
    strictly: a ``ValueError`` names the first thing that is wrong.

    What the spool wrote comes back as the spans it was written from (ids, parents,
    attributes, events, links, status, resource, scope), so the read-back of
    ``ci.trace()`` and the official OTLP exporters take them as they are.
    """
    if not isinstance(request, dict) or not isinstance(request.get("resourceSpans"), list):
        raise ValueError("not an OTLP/JSON request (an object with a resourceSpans list)")
    decoding = RequestDecoder()
    spans, _request = decoding.decode(request)
    if decoding.first is not None:
        raise ValueError(decoding.first)
    return spans


class RequestDecoder:
    """Decodes one request, keeping what reads; notes the first problem, counts the rest."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.spans = self.skipped = 0
        self.envelopes = 0  # resourceSpans and scopeSpans entries skipped
        self.dropped: dict[str, int] = {}  # by noun: attributes, events, links

    def note(self, where: str, reason: str) -> None:
        if self.first is None:
            self.first = f"{where}: {reason}"

    def decode(self, request: dict[str, Any]) -> tuple[list[ReadableSpan], dict[str, Any]]:
        """The spans of ``request`` (an object with a ``resourceSpans`` list) that read, and
        the request holding just those (less the attributes, events and links dropped)."""
        spans: list[ReadableSpan] = []
        kept = []
        for position, resource_spans in enumerate(request["resourceSpans"]):
            where = f"resourceSpans[{position}]"
            try:
                resource, envelope = self.resource(resource_spans, where)
                entries = _list(resource_spans.get("scopeSpans"), "scopeSpans")
            except _Bad as error:
                self.envelopes += 1
                self.note(where, str(error))
                continue
            envelope["scopeSpans"] = []
            for number, entry in enumerate(entries):
                scope_spans = self.scope(entry, f"{where}.scopeSpans[{number}]", resource, spans)
                if scope_spans is not None:
                    envelope["scopeSpans"].append(scope_spans)
            kept.append(envelope)
        return spans, dict(request, resourceSpans=kept)

    def resource(self, resource_spans: Any, where: str) -> tuple[Resource, dict[str, Any]]:
        if not isinstance(resource_spans, dict):
            raise _Bad("is not an object")
        resource = _object(resource_spans.get("resource"), "resource")
        attributes, items, dropped = _key_values(resource.get("attributes"), "resource.attributes")
        self.drop(where, dropped)
        envelope = dict(resource_spans, resource=dict(resource, attributes=items))
        # The resource tells processes apart (runs, ranks): a map in it is kept as text, as
        # cirron's own writer keeps one, so that every value compares and hashes.
        return Resource({k: _hashable(v) for k, v in attributes.items()}), envelope

    def scope(
        self, scope_spans: Any, where: str, resource: Resource, out: list[ReadableSpan]
    ) -> dict[str, Any] | None:
        """The ``scopeSpans`` entry holding the spans that read (appended to ``out``)."""
        try:
            if not isinstance(scope_spans, dict):
                raise _Bad("is not an object")
            scope = _object(scope_spans.get("scope"), "scope")
            name, version = scope.get("name") or "", scope.get("version")
            if not isinstance(name, str) or not isinstance(version, (str, type(None))):
                raise _Bad("scope name or version is not a string")
            entries = _list(scope_spans.get("spans"), "spans")
        except _Bad as error:
            self.envelopes += 1
            self.note(where, str(error))
            return None
        instrumentation = InstrumentationScope(name, version)
        kept = []
        for number, entry in enumerate(entries):
            self.spans += 1
            try:
                span, item, dropped = _span(entry, resource, instrumentation)
            except Exception as error:  # _Bad; anything else, so that one span costs no more
                self.skipped += 1
                self.note(
                    f"{where}.spans[{number}]",
                    str(error) if isinstance(error, _Bad) else repr(error),
                )
                continue
            self.drop(f"{where}.spans[{number}]", dropped)
            out.append(span)
            kept.append(item)
        return dict(scope_spans, spans=kept)

    def drop(self, where: str, dropped: list[str]) -> None:
        for reason in dropped:
            noun = _NOUNS[reason.split("[", 1)[0]]
            self.dropped[noun] = self.dropped.get(noun, 0) + 1
        if dropped:
            self.note(where, dropped[0])

    def summary(self, read: int) -> tuple[str, bool] | None:
        """What to say about the request, and whether nothing of it read (``read``: the spans
        that did); None when it read whole."""
        if self.first is None:
            return None
        if not read and (self.skipped or self.envelopes):
            more = self.skipped + self.envelopes + sum(self.dropped.values()) - 1
            return self.first + (f" (and {more} more)" if more else ""), True
        parts = [f"{self.skipped} of {self.spans} spans skipped"] if self.skipped else []
        if self.envelopes:
            parts.append(_counted(self.envelopes, "resourceSpans or scopeSpans entry") + " skipped")
        parts += [_counted(count, noun) + " dropped" for noun, count in self.dropped.items()]
        return ", ".join(parts) + f" (the first: {self.first})", False


def _counted(count: int, noun: str) -> str:
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{count} {noun if count == 1 else plural}"


# -- a span ---------------------------------------------------------------------------------
def _span(
    span: Any, resource: Resource, scope: InstrumentationScope
) -> tuple[ReadableSpan, dict[str, Any], list[str]]:
    """The span as an SDK span, its OTLP/JSON dict less what was dropped, and what was."""
    if not isinstance(span, dict):
        raise _Bad("is not an object")
    trace_id = _hex_id(span.get("traceId"), "traceId", 32)
    span_id = _hex_id(span.get("spanId"), "spanId", 16)
    parent_id = span.get("parentSpanId")
    parent_id = _hex_id(parent_id, "parentSpanId", 16, zero=True) if parent_id else None
    name = span.get("name")
    if not isinstance(name, str):
        raise _Bad("name is not a string")
    start = _unsigned(span.get("startTimeUnixNano"), "startTimeUnixNano", 64)
    end = span.get("endTimeUnixNano")
    end = _unsigned(end, "endTimeUnixNano", 64) if end is not None else None
    kind = span.get("kind", 1)
    kind = _KINDS.get(kind) if isinstance(kind, str) else kind
    if type(kind) is not int or not 0 <= kind < len(_SPAN_KINDS):
        raise _Bad("kind is not a span kind (0 to 5)")
    flags = _unsigned(span.get("flags", 0), "flags", 32)
    status = _status(span.get("status"))
    attributes, kept_attributes, dropped = _key_values(span.get("attributes"), "attributes")
    events, kept_events, dropped_events = _items(span.get("events"), "events", _event)
    links, kept_links, dropped_links = _items(span.get("links"), "links", _link)
    context = SpanContext(trace_id, span_id, False, _SAMPLED)
    readable = ReadableSpan(
        name=name,
        context=context,
        parent=(
            SpanContext(trace_id, parent_id, bool(flags & REMOTE_PARENT), _SAMPLED)
            if parent_id
            else None
        ),
        resource=resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=_SPAN_KINDS[kind],
        status=status,
        start_time=start,
        end_time=end or None,  # 0: never ended (OTLP's default)
        instrumentation_scope=scope,
    )
    if dropped or dropped_events or dropped_links:
        span = dict(span, attributes=kept_attributes, events=kept_events, links=kept_links)
        dropped = dropped + dropped_events + dropped_links
    return readable, span, dropped


def decode_span(span: Any, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """One OTLP/JSON span as an SDK span, strictly: a ``ValueError`` says what is wrong
    (and the span is to be skipped); an attribute, event or link that is wrong is dropped."""
    return _span(span, resource, scope)[0]


def _event(event: Any) -> Event:
    event = _object(event, "event")
    name = event.get("name", "")
    if not isinstance(name, str):
        raise _Bad("name is not a string")
    time = _unsigned(event.get("timeUnixNano"), "timeUnixNano", 64)
    attributes, _kept, dropped = _key_values(event.get("attributes"), "attributes")
    if dropped:  # an event's attributes are its meaning (a mark's value): all or nothing
        raise _Bad(dropped[0])
    return Event(name, attributes, time)


def _link(link: Any) -> Link:
    link = _object(link, "link")
    trace_id = _hex_id(link.get("traceId"), "traceId", 32)
    span_id = _hex_id(link.get("spanId"), "spanId", 16)
    attributes, _kept, dropped = _key_values(link.get("attributes"), "attributes")
    if dropped:
        raise _Bad(dropped[0])
    return Link(SpanContext(trace_id, span_id, False, _SAMPLED), attributes)


def _items(
    value: Any, field: str, decode: Callable[[Any], Any]
) -> tuple[list[Any], list[Any], list[str]]:
    """(decoded, the JSON items kept, why each other one was dropped) of a list field."""
    decoded: list[Any] = []
    kept: list[Any] = []
    dropped: list[str] = []
    if value is None:  # the common case: no links, and no events but marks
        return decoded, kept, dropped
    for position, item in enumerate(_list(value, field)):
        try:
            decoded.append(decode(item))
        except _Bad as error:
            dropped.append(f"{field}[{position}]: {error}")
            continue
        kept.append(item)
    return decoded, kept, dropped


def _status(status: Any) -> Status:
    if status is None:
        return _UNSET
    status = _object(status, "status")
    code = status.get("code", 0)
    code = _STATUS_NAMES.get(code, -1) if isinstance(code, str) else code
    if type(code) is not int or code not in _STATUS_CODES:
        raise _Bad("status code is not 0, 1 or 2")
    message = status.get("message")
    if not isinstance(message, (str, type(None))):
        raise _Bad("status message is not a string")
    # The SDK warns about a message on a status that is not an error, and drops it.
    return Status(_STATUS_CODES[code], message if code == 2 else None)


# -- values ---------------------------------------------------------------------------------
def _object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Bad(f"{field} is not an object")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(f"{field} is not a list")
    return value


def _is_id(value: Any, digits: int) -> bool:
    return isinstance(value, str) and _HEX[digits].fullmatch(value) is not None


def _hex_id(value: Any, field: str, digits: int, zero: bool = False) -> int:
    if type(value) is not str or _HEX[digits].fullmatch(value) is None:
        raise _Bad(f"{field} is not {digits} hex digits")
    number = int(value, 16)
    if not number and not zero:
        raise _Bad(f"{field} is all zeros")
    return number


def _unsigned(value: Any, field: str, bits: int) -> int:
    """An OTLP unsigned integer: a JSON integer or its decimal text."""
    if type(value) is str and _INTEGER.fullmatch(value):
        value = int(value)
    if type(value) is not int or not 0 <= value < 2**bits:
        raise _Bad(f"{field} is not an integer of {bits} bits (or its text)")
    return value


def _key_values(items: Any, field: str) -> tuple[dict[str, Any], list[Any], list[str]]:
    """(the attributes as a dict, the JSON items kept, why each other one was dropped)."""
    attributes: dict[str, Any] = {}
    kept: list[Any] = []
    dropped: list[str] = []
    if items is None or items == []:
        return attributes, kept, dropped
    for position, item in enumerate(_list(items, field)):
        try:
            key, value = _key_value(item, 0)
            if key == semconv.PARENT_SPAN_ID and not _is_id(value, 16):  # cirron's: it links
                raise _Bad(f"{key} is not 16 hex digits")  # an epoch to its parent
        except _Bad as error:
            dropped.append(f"{field}[{position}]: {error}")
            continue
        attributes[key] = value
        kept.append(item)
    return attributes, kept, dropped


def _key_value(item: Any, depth: int) -> tuple[str, Any]:
    if not isinstance(item, dict):
        raise _Bad("is not a key/value object")
    key = item.get("key")
    if not isinstance(key, str) or not key:
        raise _Bad("key is not a non-empty string")
    return key, plain_value(item.get("value"), depth)


def plain_value(value: Any, depth: int = 0) -> Any:
    """The Python value of an OTLP/JSON ``AnyValue`` (an array a tuple, a map a dict); a
    ``ValueError`` says what is wrong with it, also when nested more than
    :data:`MAX_VALUE_DEPTH` levels."""
    if value is None or value == {}:
        return None  # unset
    if not isinstance(value, dict) or len(value) != 1:
        raise _Bad("value is not an object with one member")
    ((kind, content),) = value.items()
    if kind == "stringValue" and isinstance(content, str):
        return content
    if kind == "boolValue" and isinstance(content, bool):
        return content
    if kind == "intValue":
        if isinstance(content, str) and _INTEGER.fullmatch(content):
            content = int(content)
        if type(content) is int and -(2**63) <= content < 2**63:
            return content
    if kind == "doubleValue":
        return _double(content)
    if kind == "bytesValue" and isinstance(content, str):
        try:
            return base64.b64decode(content, validate=True)
        except ValueError:  # binascii.Error, or text that is not ASCII
            pass
    if kind in ("arrayValue", "kvlistValue"):
        if depth >= MAX_VALUE_DEPTH:
            raise _Bad(f"value nested more than {MAX_VALUE_DEPTH} levels")
        values = _list(_object(content, kind).get("values"), f"{kind} values")
        if kind == "arrayValue":
            return tuple(plain_value(item, depth + 1) for item in values)
        return dict(_key_value(item, depth + 1) for item in values)
    raise _Bad(f"{kind!r:.40} is not a value of its type")  # (repr: the key is anything)


def _double(content: Any) -> float:
    if isinstance(content, str):
        if content in _NON_FINITE_TEXT:
            return _NON_FINITE_TEXT[content]
        try:
            return float(content)  # proto3 JSON allows a number as text
        except ValueError:
            pass
    elif isinstance(content, (int, float)) and not isinstance(content, bool):
        try:
            return float(content)
        except OverflowError:  # an integer beyond a double's range
            pass
    raise _Bad("doubleValue is not a number")


def plain_attributes(key_values: Any) -> dict[str, Any]:
    """The Python dict of an OTLP/JSON ``KeyValue`` list, strictly (``ValueError``)."""
    attributes, _kept, dropped = _key_values(key_values, "attributes")
    if dropped:
        raise _Bad(dropped[0])
    return attributes


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return str(value)
    return value
