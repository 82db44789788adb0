"""Spans as OTLP/JSON: the standard JSON encoding of ``ExportTraceServiceRequest``.

Written directly from ``ReadableSpan`` (no protobuf round trip, which costs
more than the rest of the export). The encoding follows the OTLP spec: ids as
hex strings, lowerCamelCase keys, enums as integers, 64-bit integers as
strings, and non-finite doubles as the proto3 JSON strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` (plain JSON has no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _double(value: float) -> float | str:
    return value if math.isfinite(value) else _NON_FINITE[str(value)]


def any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    if isinstance(value, bytes):
        import base64

        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    return {"stringValue": str(value)}


def key_values(attributes: Any) -> list[dict[str, Any]]:
    if not attributes:
        return []
    return [{"key": key, "value": any_value(value)} for key, value in attributes.items()]


def _span(span: Any) -> dict[str, Any]:
    context = span.context
    encoded: dict[str, Any] = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
        "name": span.name,
        "kind": span.kind.value + 1,  # OTLP enums count from SPAN_KIND_UNSPECIFIED = 0
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": key_values(span.attributes),
        "flags": 0x100 | int(context.trace_flags),  # HAS_IS_REMOTE (not remote) + trace flags
    }
    if span.parent is not None:
        encoded["parentSpanId"] = format(span.parent.span_id, "016x")
        if span.parent.is_remote:
            encoded["flags"] |= 0x200
    trace_state = context.trace_state.to_header() if context.trace_state else ""
    if trace_state:
        encoded["traceState"] = trace_state
    if span.dropped_attributes:
        encoded["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        encoded["events"] = [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                "attributes": key_values(event.attributes),
            }
            for event in span.events
        ]
    if span.dropped_events:
        encoded["droppedEventsCount"] = span.dropped_events
    if span.links:
        encoded["links"] = [
            {
                "traceId": format(link.context.trace_id, "032x"),
                "spanId": format(link.context.span_id, "016x"),
                "attributes": key_values(link.attributes),
            }
            for link in span.links
        ]
    if span.dropped_links:
        encoded["droppedLinksCount"] = span.dropped_links
    status = span.status
    if status.status_code.value:
        encoded["status"] = {"code": status.status_code.value}
        if status.description:
            encoded["status"]["message"] = status.description
    return encoded


def encode_request(spans: Sequence[Any]) -> dict[str, Any]:
    """An ``ExportTraceServiceRequest`` dict, spans grouped by resource and scope."""
    by_resource: dict[int, tuple[Any, dict[Any, list[dict[str, Any]]]]] = {}
    for span in spans:
        resource = span.resource
        entry = by_resource.get(id(resource))
        if entry is None:
            entry = by_resource[id(resource)] = (resource, {})
        scope = span.instrumentation_scope
        entry[1].setdefault(scope, []).append(_span(span))
    resource_spans = []
    for resource, scopes in by_resource.values():
        scope_spans = []
        for scope, encoded in scopes.items():
            item: dict[str, Any] = {"spans": encoded}
            if scope is not None:
                item["scope"] = {"name": scope.name}
                if scope.version:
                    item["scope"]["version"] = scope.version
                if scope.schema_url:
                    item["schemaUrl"] = scope.schema_url
            scope_spans.append(item)
        entry_json: dict[str, Any] = {
            "resource": {"attributes": key_values(resource.attributes if resource else {})},
            "scopeSpans": scope_spans,
        }
        if resource is not None and resource.schema_url:
            entry_json["schemaUrl"] = resource.schema_url
        resource_spans.append(entry_json)
    return {"resourceSpans": resource_spans}
