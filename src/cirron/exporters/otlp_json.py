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
:mod:`cirron.exporters.otlp_json_decoder`'s (``decode_request``, also importable here).
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
from .otlp_json_decoder import REMOTE_PARENT as _REMOTE_PARENT
from .otlp_json_decoder import decode_request as decode_request  # the one decoder, there

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


def key_values(attributes: Mapping[str, Any] | None) -> str:
    """A JSON array of OTLP ``KeyValue``s."""
    if not attributes:
        return "[]"
    pairs = [
        f'{{"key":{_quote(key)},"value":{any_value(value)}}}' for key, value in attributes.items()
    ]
    return "[" + ",".join(pairs) + "]"


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


class _Encoder:
    """Encodes the spans of one request; caches what spans of one trace share."""

    def __init__(self) -> None:
        self._traces: dict[int, tuple[str, str | None, bool]] = {}

    def span(self, span: Any) -> str:
        if type(span) is ScopeSpan:
            return self._scope_span(span)
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
        # Our lean span's fields are read directly: its SpanContext is built lazily.
        trace_id = span._trace_id
        trace = self._traces.get(trace_id)
        if trace is None:
            trace = self._traces[trace_id] = _trace_fields(span)
        parent = span._parent_span
        if parent is None:
            parent_id, remote = None, False
        elif type(parent) is ScopeSpan:
            parent_id, remote = parent._span_id, False
        else:
            parent_context = parent.get_span_context()
            parent_id, remote = parent_context.span_id, parent_context.is_remote
        text = _text(
            trace,
            span._span_id,
            parent_id,
            remote,
            span._name,
            _KIND_INTERNAL,
            span._start_time,
            span._end_time,
            span._attributes,
        )
        events, links, status = span._events, span._links, span._status
        if not links and status is UNSET_STATUS and not span._dropped_events:
            # The common case: at most events (marks).
            return text + (_events(events) + "}" if events else "}")
        return text + _tail(span, events, links, status, span._dropped_events)


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
        + f',"flags":{(_FLAGS | _REMOTE_PARENT) if remote else _FLAGS}'
    )


def _scope_json(scope: Any) -> str:
    if scope is None:
        return ""
    fields = '"name":' + _quote(scope.name)
    if scope.version:
        fields += ',"version":' + _quote(scope.version)
    schema = ',"schemaUrl":' + _quote(scope.schema_url) if scope.schema_url else ""
    return '"scope":{' + fields + "}" + schema + ","


def encode_request(spans: Sequence[Any]) -> str:
    """An ``ExportTraceServiceRequest`` as OTLP/JSON text, spans grouped by resource and scope.

    Each span is a line of its own; the resource and scope before a scope's spans are one line.
    """
    encoder = _Encoder()
    by_resource: dict[int, tuple[Any, dict[Any, list[str]]]] = {}
    for span in spans:
        if type(span) is ScopeSpan:
            resource, scope = span._state.resource, span._state.scope
        else:
            resource, scope = span.resource, span.instrumentation_scope
        entry = by_resource.get(id(resource))
        if entry is None:
            entry = by_resource[id(resource)] = (resource, {})
        encoded = entry[1].get(scope)
        if encoded is None:
            encoded = entry[1][scope] = []
        encoded.append(encoder.span(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        # A span a line (JSON allows the breaks; every string is escaped, so a value never
        # holds one): a file cut short still gives its whole lines (spool_reader.salvage).
        scope_spans = ",".join(
            "{" + _scope_json(scope) + '"spans":[\n' + ",\n".join(encoded) + "\n]}"
            for scope, encoded in scopes.items()
        )
        schema = (
            ',"schemaUrl":' + _quote(resource.schema_url)
            if resource is not None and resource.schema_url
            else ""
        )
        resource_spans.append(
            '{"resource":{"attributes":'
            + key_values(resource.attributes if resource is not None else {})
            + '},"scopeSpans":['
            + scope_spans
            + "]"
            + schema
            + "}"
        )
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}"
