"""Spans as OTLP/JSON text: the standard JSON encoding of ``ExportTraceServiceRequest``.

The text is written directly from ``ReadableSpan`` fields, span by span, with
no intermediate dicts and no protobuf round trip: at a sustained hundred
thousand spans a second the encoding is most of the export's cost, and it runs
on the sink's thread, which shares the interpreter with training. The encoding
follows the OTLP spec: ids as hex strings, lowerCamelCase keys, enums as
integers, 64-bit integers as strings, and non-finite doubles as the proto3
JSON strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (plain JSON has no
NaN). Strings are escaped to ASCII, so a control character or a lone
surrogate in a value can never break a file. Reading a request back is
:mod:`cirron.exporters.otlp_json_decoder`'s, which the writer does not load.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quote  # type: ignore[attr-defined]
from typing import Any

from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Link, SpanKind, Status

from ..otel.spans import UNSET_STATUS, MarkEvent, ScopeSpan

REMOTE_PARENT = 0x200  # OTLP span flags: the parent's context came from another process
_NON_FINITE = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}
# OTLP enums count from SPAN_KIND_UNSPECIFIED = 0, the API's from INTERNAL = 0.
_KINDS = {kind: kind.value + 1 for kind in SpanKind}
_KIND_INTERNAL = _KINDS[SpanKind.INTERNAL]
_FLAGS = 0x100 | 0x01  # HAS_IS_REMOTE (parent is local) | SAMPLED


def _double(value: float) -> str:
    return repr(value) if math.isfinite(value) else _NON_FINITE[str(value)]


def any_value(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return '{"stringValue":' + _quote(value) + "}"
    if kind is float:
        return '{"doubleValue":' + _double(value) + "}"
    if kind is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if kind is int:
        return '{"intValue":"' + str(value) + '"}'
    if isinstance(value, (list, tuple)):
        return '{"arrayValue":{"values":[' + ",".join(map(any_value, value)) + "]}}"
    if isinstance(value, bool):
        return any_value(bool(value))
    if isinstance(value, int):
        return any_value(int(value))
    if isinstance(value, float):
        return any_value(float(value))
    if isinstance(value, bytes):
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    return any_value(str(value))


# Each attribute key's text before its value, for the first keys seen: a run's spans carry
# a few keys, over and over.
_KEY_TEXTS: dict[str, str] = {}
_MAX_KEY_TEXTS = 4096


def key_values(attributes: Mapping[str, Any] | None) -> str:
    """A JSON array of OTLP ``KeyValue``s."""
    if not attributes:
        return "[]"
    pairs = []
    for key, value in attributes.items():
        text = _KEY_TEXTS.get(key) or _key_text(key)
        pairs.append(text + any_value(value) + "}")
    return "[" + ",".join(pairs) + "]"


def _key_text(key: str) -> str:
    text = '{"key":' + _quote(key) + ',"value":'
    if len(_KEY_TEXTS) < _MAX_KEY_TEXTS:
        _KEY_TEXTS[key] = text
    return text


def _trace_fields(span: Any) -> tuple[str, str | None, bool]:
    """(hex trace id, W3C trace state header or None, parent is remote) for ``span``."""
    context = span.get_span_context()
    parent = span.parent
    header = context.trace_state.to_header() if context.trace_state else ""
    return (
        format(context.trace_id, "032x"),
        header or None,
        parent is not None and parent.is_remote,
    )


def _events(events: Sequence[Event]) -> str:
    encoded = []
    for event in events:
        if type(event) is MarkEvent:  # ours: its fields directly, the properties cost a call each
            timestamp, name, attributes = event._timestamp, event._name, event._attributes
        else:  # an SDK span's
            timestamp, name, attributes = event.timestamp, event.name, event.attributes
        encoded.append(
            f'{{"timeUnixNano":"{timestamp}","name":{_quote(name)}'
            f',"attributes":{key_values(attributes)}}}'
        )
    return ',"events":[' + ",".join(encoded) + "]"


def _tail(
    span: Any,
    events: Sequence[Event],
    links: Sequence[Link],
    status: Status,
    dropped_events: int,
) -> str:
    """The optional members: events, links, dropped counts, status."""
    parts = [_events(events)] if events else []
    if dropped_events:
        parts.append(f',"droppedEventsCount":{dropped_events}')
    if links:
        parts.append(
            ',"links":['
            + ",".join(
                f'{{"traceId":"{link.context.trace_id:032x}","spanId":"{link.context.span_id:016x}"'
                f',"attributes":{key_values(link.attributes)}}}'
                for link in links
            )
            + "]"
        )
    dropped_links = span.dropped_links
    if dropped_links:
        parts.append(f',"droppedLinksCount":{dropped_links}')
    dropped_attributes = span.dropped_attributes
    if dropped_attributes:
        parts.append(f',"droppedAttributesCount":{dropped_attributes}')
    code = status.status_code.value
    if code:
        message = status.description
        parts.append(
            f',"status":{{"code":{code}'
            + (',"message":' + _quote(message) if message else "")
            + "}"
        )
    return "".join(parts) + "}"


# A cirron span in one formatting: (the trace's head, span id, parent, trace state, name,
# start, end, attributes, flags, the rest).
_SCOPE_SPAN = '%s%016x%s%s%s%s","endTimeUnixNano":"%s","attributes":%s%s%s'
_LOCAL_FLAGS = f',"flags":{_FLAGS}'
_REMOTE_FLAGS = f',"flags":{_FLAGS | REMOTE_PARENT}'


class _Encoder:
    """Encodes the spans of one request; caches what spans of one trace, or one name, share."""

    # Slots: the compiled twin of _scope_span reads the caches by their offsets.
    __slots__ = ("_traces", "_heads", "_names", "_parents")

    def __init__(self) -> None:
        self._traces: dict[int, tuple[str, str | None, bool]] = {}
        # cirron's spans: per trace, the text before the span id and the trace state's
        # member; per name, the text from the name to the start time; per parent of
        # cirron's, the member that names it.
        self._heads: dict[int, tuple[str, str]] = {}
        self._names: dict[str, str] = {}
        self._parents: dict[int, str] = {}

    def span(self, span: Any) -> str:
        if type(span) is ScopeSpan:
            return scope_span(self, span)
        context = span.get_span_context()
        trace = _trace_fields(span)
        parent = span.parent
        return _text(
            trace,
            context.span_id,
            parent.span_id if parent is not None else None,
            trace[2],
            span.name,
            _KINDS.get(span.kind, 0),
            span.start_time,
            span.end_time,
            span.attributes,
        ) + _tail(span, span.events, span.links, span.status, span.dropped_events)

    def _scope_span(self, span: ScopeSpan) -> str:
        """What :func:`_text` and :func:`_tail` write, for one of our lean spans: its fields
        read directly (its SpanContext is built lazily), and what its trace, its name and its
        parent share with other spans written once a request. Every span of a run comes
        here, on a thread that shares the interpreter with training."""
        head = self._heads.get(span._trace_id)
        if head is None:
            head = self._head(span)
        parent, remote = span._parent_span, False
        if parent is None:
            parent_text = '"'
        elif type(parent) is ScopeSpan:
            parent_id = parent._span_id
            parent_text = self._parents.get(parent_id) or self._parent(parent_id)
        else:
            parent_context = parent.get_span_context()
            parent_text, remote = _parent_text(parent_context.span_id), parent_context.is_remote
        named = self._names.get(span._name) or self._name(span._name)
        attributes, events = span._attributes, span._events
        if not span._links and span._status is UNSET_STATUS and not span._dropped_events:
            rest = _events(events) + "}" if events else "}"  # the common case: marks at most
        else:
            rest = _tail(span, events, span._links, span._status, span._dropped_events)
        return _SCOPE_SPAN % (
            head[0],
            span._span_id,
            parent_text,
            head[1],
            named,
            span._start_time,
            span._end_time,
            key_values(attributes) if attributes else "[]",
            _REMOTE_FLAGS if remote else _LOCAL_FLAGS,
            rest,
        )

    def _parent(self, parent_id: int) -> str:
        text = self._parents[parent_id] = _parent_text(parent_id)
        return text

    def _name(self, name: str) -> str:
        named = self._names[name] = (
            f',"name":{_quote(name)},"kind":{_KIND_INTERNAL},"startTimeUnixNano":"'
        )
        return named

    def _head(self, span: ScopeSpan) -> tuple[str, str]:
        trace_id = span._trace_id
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _trace_fields(span)
        head = self._heads[trace_id] = (
            f'{{"traceId":"{trace[0]}","spanId":"',
            ',"traceState":' + _quote(trace[1]) if trace[1] else "",
        )
        return head


# The encoding of one of cirron's spans (the compiled twin, where it is built).
scope_span = _Encoder._scope_span


def _parent_text(parent_id: int) -> str:
    return f'","parentSpanId":"{parent_id:016x}"'


def _text(
    trace: tuple[str, str | None, bool],
    span_id: int,
    parent_id: int | None,
    remote: bool,
    name: str,
    kind: int,
    start: int | None,
    end: int | None,
    attributes: Any,
) -> str:
    """A span's JSON object up to (not including) its optional members and ``}``."""
    return (
        f'{{"traceId":"{trace[0]}","spanId":"{span_id:016x}"'
        + (f',"parentSpanId":"{parent_id:016x}"' if parent_id is not None else "")
        + (',"traceState":' + _quote(trace[1]) if trace[1] else "")
        + f',"name":{_quote(name)},"kind":{kind},"startTimeUnixNano":"{start}"'
        + f',"endTimeUnixNano":"{end}","attributes":{key_values(attributes)}'
        + f',"flags":{(_FLAGS | REMOTE_PARENT) if remote else _FLAGS}'
    )


def _scope_json(scope: Any) -> str:
    if scope is None:
        return ""
    fields = '"name":' + _quote(scope.name)
    if scope.version:
        fields += ',"version":' + _quote(scope.version)
    schema = ',"schemaUrl":' + _quote(scope.schema_url) if scope.schema_url else ""
    return '"scope":{' + fields + "}" + schema + ","


def _spans_of(
    by_resource: dict[int, tuple[Any, dict[Any, list[str]]]], resource: Any, scope: Any
) -> list[str]:
    """The list of the spans of ``resource`` and ``scope`` in ``by_resource``, made if new."""
    entry = by_resource.get(id(resource))
    if entry is None:
        entry = by_resource[id(resource)] = (resource, {})
    encoded = entry[1].get(scope)
    if encoded is None:
        encoded = entry[1][scope] = []
    return encoded


def encode_request(spans: Sequence[Any]) -> str:
    """An ``ExportTraceServiceRequest`` as OTLP/JSON text, spans grouped by resource and scope.

    Each span is a line of its own; the resource and scope before a scope's spans are one line.
    """
    encoder = _Encoder()
    by_resource: dict[int, tuple[Any, dict[Any, list[str]]]] = {}
    # The list of each tracer's spans (cirron's spans): found once a request, not by
    # hashing a scope (in Python) for every span.
    by_tracer: dict[Any, list[str]] = {}
    for span in spans:
        if type(span) is ScopeSpan:
            encoded = by_tracer.get(span._state)
            if encoded is None:
                state = span._state
                encoded = by_tracer[state] = _spans_of(by_resource, state.resource, state.scope)
            encoded.append(scope_span(encoder, span))
        else:
            encoded = _spans_of(by_resource, span.resource, span.instrumentation_scope)
            encoded.append(encoder.span(span))
    # The request's text as a list of pieces joined once: each ``+`` of a request's spans
    # would copy all of them again.
    parts = ['{"resourceSpans":[']
    for at, (resource, scopes) in enumerate(by_resource.values()):
        parts.append(',{"resource":{"attributes":' if at else '{"resource":{"attributes":')
        parts.append(key_values(resource.attributes if resource is not None else {}))
        parts.append('},"scopeSpans":[')
        for number, (scope, encoded) in enumerate(scopes.items()):
            # A span a line (JSON allows the breaks; every string is escaped, so a value
            # never holds one): a file cut short still gives its whole lines
            # (spool_reader.salvage).
            parts.append(("," if number else "") + "{" + _scope_json(scope) + '"spans":[\n')
            parts.append(",\n".join(encoded))
            parts.append("\n]}")
        parts.append("]")
        if resource is not None and resource.schema_url:
            parts.append(',"schemaUrl":' + _quote(resource.schema_url))
        parts.append("}")
    parts.append("]}")
    return "".join(parts)


# The pure-Python functions are the reference (tests compare the text of both). Where the
# compiled helper is built, cirron's spans, their attributes and their marks are written by
# its twins, which hand a span off the common path (links, a status, a parent of another
# tracer), a value of another type, or an event that is not a mark's, back to these.
PURE_TWINS = {"key_values": key_values, "_events": _events, "scope_span": scope_span}


def use_compiled(compiled: Any) -> None:
    """Write attributes and marks with ``compiled``'s twins (``cirron.recording._hot``, which
    :mod:`cirron.recording.hot` hands over where it is built)."""
    global key_values, _events, scope_span
    compiled.configure_encoder(
        quote=_quote,
        key_texts=_KEY_TEXTS,
        key_text=_key_text,
        any_value=any_value,
        key_values=PURE_TWINS["key_values"],
        events=PURE_TWINS["_events"],
        mark_event=MarkEvent,
        non_finite=_NON_FINITE,
        scope_span=PURE_TWINS["scope_span"],
        encoder=_Encoder,
        local_flags=_LOCAL_FLAGS,
    )
    key_values, _events, scope_span = compiled.key_values, compiled.events, compiled.scope_span
