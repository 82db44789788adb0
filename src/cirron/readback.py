"""``ci.trace()``: the session's spans as text, dict, JSON or a DataFrame.

Reads the bounded in-memory store, so it never touches the disk and works
with or without ``ci.profile()``.
"""

from __future__ import annotations

import json
from typing import Any

from . import lines
from .recorder import Recorder

FORMATS = ("text", "dict", "json", "df")
DF_COLUMNS = [
    "name",
    "index",
    "span_id",
    "parent_id",
    "depth",
    "start_ns",
    "end_ns",
    "duration_ns",
    "status",
    "attributes",
    "marks",
    "events",
]


class TraceText(str):
    """A str that shows as the tree itself in a notebook or REPL."""

    def __repr__(self) -> str:
        return str(self)


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _node(span: Any) -> dict[str, Any]:
    attributes = {key: _plain(value) for key, value in (span.attributes or {}).items()}
    marks = [
        {"name": name, "value": value, "kind": "point", "time_ns": time_ns}
        for name, value, time_ns in lines.point_marks(span)
    ]
    marks += [
        {"name": name, "value": value, "kind": "summary", "time_ns": span.end_time}
        for name, value in lines.summary_marks(span)
    ]
    # Events that are not marks: a snapshot's per-tensor stats, recorded exceptions.
    events = [
        {
            "name": event.name,
            "time_ns": event.timestamp,
            "attributes": {key: _plain(value) for key, value in (event.attributes or {}).items()},
        }
        for event in span.events
        if not lines.is_point_mark(event)
    ]
    links = [
        {"trace_id": format(link.context.trace_id, "032x"), "span_id": _hex(link.context.span_id)}
        for link in span.links or ()
    ]
    end = span.end_time
    return {
        "name": span.name,
        "index": attributes.get("index"),
        "span_id": _hex(span.context.span_id),
        # A long run's later epochs begin traces of their own: their parent in the tree
        # is named by an attribute (see cirron.scopes.open_root).
        "parent_id": (
            _hex(span.parent.span_id)
            if span.parent is not None
            else attributes.get("cirron.parent_span_id")
        ),
        "start_ns": span.start_time,
        "end_ns": end,
        "duration_ns": end - span.start_time if end is not None else None,
        "status": span.status.status_code.name,
        "attributes": attributes,
        "marks": marks,
        "events": events,
        "links": links,
        "children": [],
    }


def _tree(rec: Recorder) -> tuple[dict[str, Any] | None, list[tuple[dict[str, Any], Any]]]:
    """The root node, and every (node, span) pair in end order, open spans last."""
    assert rec.store is not None
    spans = rec.store.ended_spans() + rec.store.open_spans()
    pairs = [(_node(span), span) for span in spans]
    by_id = {node["span_id"]: node for node, _span in pairs}
    root_id = _hex(rec.session.context.span_id) if rec.session is not None else None
    root = by_id.get(root_id) if root_id else None
    for node, _span in pairs:
        if node is root:
            continue
        parent = by_id.get(node["parent_id"]) if node["parent_id"] else None
        if parent is None:
            parent = root  # parent evicted, or a span from another trace
        if parent is not None:
            parent["children"].append(node)
    for node, _span in pairs:
        node["children"].sort(key=lambda child: child["start_ns"])
    return root, pairs


def _select(
    root: dict[str, Any] | None,
    pairs: list[tuple[dict[str, Any], Any]],
    name: str | None,
    last: int | None,
) -> list[dict[str, Any]] | None:
    if name is None and last is None:
        return None
    nodes = [node for node, _span in pairs if name is None or node["name"] == name]
    if last is not None:
        closed = [node for node in nodes if node["end_ns"] is not None]
        nodes = closed[-last:] if last else []
    else:
        nodes.sort(key=lambda node: node["start_ns"])
    return nodes


def _text(nodes: list[dict[str, Any]], evicted: int) -> str:
    out: list[str] = []
    if evicted:
        out.append(f"({evicted} older spans were evicted from the in-memory trace buffer)")

    def walk(node: dict[str, Any], depth: int) -> None:
        out.append("  " * depth + lines.span_line(_NodeView(node)))
        for child in node["children"]:
            walk(child, depth + 1)

    for node in nodes:
        walk(node, 0)
    return "\n".join(out)


class _NodeView:
    """Lets :func:`lines.span_line` read a node like a span."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.name = node["name"]
        self.attributes = node["attributes"]
        self.start_time = node["start_ns"]
        self.end_time = node["end_ns"]
        self._marks = node["marks"]

    @property
    def events(self) -> list[Any]:
        return [_Event(m) for m in self._marks if m["kind"] == "point"]


class _Event:
    def __init__(self, mark: dict[str, Any]) -> None:
        self.name = mark["name"]
        self.attributes = {"value": mark["value"]}
        self.timestamp = mark["time_ns"]


def _frame(nodes: list[dict[str, Any]]) -> Any:
    try:
        import pandas as pd
    except ImportError as error:
        raise ImportError(
            "ci.trace(format='df') needs pandas: pip install pandas "
            "(or pip install 'cirron-otel[test]')"
        ) from error
    rows: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        rows.append({column: node.get(column) for column in DF_COLUMNS} | {"depth": depth})
        for child in node["children"]:
            walk(child, depth + 1)

    for node in nodes:
        walk(node, 0)
    return pd.DataFrame(rows, columns=DF_COLUMNS)


def render(
    rec: Recorder | None, format: str = "text", name: str | None = None, last: int | None = None
) -> Any:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 0):
        raise ValueError(f"last must be a non-negative int, got {last!r}")
    pairs: list[tuple[dict[str, Any], Any]] = []
    root: dict[str, Any] | None = None
    evicted = 0
    if rec is not None and rec.store is not None:
        root, pairs = _tree(rec)
        evicted = rec.store.evicted
    selected = _select(root, pairs, name, last)
    nodes = selected if selected is not None else ([root] if root is not None else [])
    if format == "dict":
        return selected if selected is not None else root
    if format == "json":
        return json.dumps(selected if selected is not None else root)
    if format == "df":
        return _frame(nodes)
    return TraceText(_text(nodes, evicted))
