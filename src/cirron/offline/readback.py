"""``ci.trace()``: the session's spans as text, dict, JSON or a DataFrame.

Reads the bounded in-memory store, so it never touches the disk and works
with or without ``ci.profile()``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

from opentelemetry.trace import Status, StatusCode

from ..exporters import lines
from ..otel import semconv
from ..recording.recorder import Recorder
from . import findings, runs

FORMATS = ("text", "dict", "json", "df")
PARENT_CYCLE = "parent cycle"  # the "note" of a span whose parents lead back to it
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
    """A str that shows as the tree itself in a REPL, and as a collapsible tree in a notebook."""

    _nodes: list[dict[str, Any]] = []  # the trees the text was made from (for the HTML form)
    _spans: list[Any] = []  # the spans behind them (for the findings above the tree)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        """Each span a line; those with children fold (the top two levels start open)."""
        out = _findings_html(self._spans)
        out.append('<div style="font-family: monospace; white-space: pre">')

        # A stack, not a recursion: a tree of any depth shows.
        stack: list[Any] = [(node, 0) for node in reversed(self._nodes)]
        while stack:
            item = stack.pop()
            if isinstance(item, str):  # the end of a node with children
                out.append(item)
                continue
            node, depth = item
            line = html.escape(_line(node))
            if not node["children"]:
                out.append(f'<div style="margin-left: 1.2em">{line}</div>')
                continue
            opened = " open" if depth < 2 else ""
            out.append(f'<details{opened} style="margin-left: {0 if depth == 0 else 1.2}em">')
            out.append(f"<summary>{line}</summary>")
            stack.append("</details>")
            stack.extend((child, depth + 1) for child in reversed(node["children"]))
        out.append("</div>")
        return "".join(out)


def _findings_html(spans: list[Any]) -> list[str]:
    """The findings about the run(s), as a list above the tree (none for a bare tree)."""
    found = [finding for run in runs.runs_of(spans) for finding in findings.diagnose(run)]
    shown = [f for f in found if f.severity != findings.INFO or f.chart == "stalls"]
    if not shown:
        return []
    items = "".join(
        f"<li><b>{html.escape(f.severity)}</b> {html.escape(f.text)}"
        + (f"<br><i>next:</i> {html.escape(f.action)}" if f.action else "")
        + "</li>"
        for f in shown
    )
    return [f'<ul class="cirron-findings">{items}</ul>']


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _node(span: Any) -> dict[str, Any]:
    if getattr(span, "_deferred", None):  # read back now: what the device still owes
        span.resolve_deferred(final=True)
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
        "index": attributes.get(semconv.INDEX),
        "span_id": _hex(span.context.span_id),
        # A long run's later epochs begin traces of their own: their parent in the tree
        # is named by an attribute (see cirron.recording.scopes.open_root).
        "parent_id": (
            _hex(span.parent.span_id) if span.parent is not None else _named_parent(attributes)
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


def _named_parent(attributes: dict[str, Any]) -> str | None:
    named = attributes.get(semconv.PARENT_SPAN_ID)
    return named if isinstance(named, str) else None  # a spool from elsewhere may hold anything


def _tree(
    spans: list[Any], root_id: str | None
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], Any]]]:
    """The root nodes, and every (node, span) pair in the order given.

    ``root_id``: the session of ``ci.trace()``: a span whose parent is not
    here hangs under it. Without one (a spool of several processes), such a
    span is a root of its own. A span that is its own parent, or whose parents
    lead back to it, would hang from nothing: see :func:`_break_cycles`.
    """
    pairs = [(_node(span), span) for span in spans]
    by_id = {node["span_id"]: node for node, _span in pairs}
    root = by_id.get(root_id) if root_id else None
    roots = [root] if root is not None else []
    parents: dict[int, dict[str, Any]] = {}  # by id() of the child
    for node, _span in pairs:
        if node is root:
            continue
        parent = by_id.get(node["parent_id"]) if node["parent_id"] else None
        if parent is None:
            parent = root  # parent evicted, or a span from another trace
        if parent is not None:
            parent["children"].append(node)
            parents[id(node)] = parent
        else:
            roots.append(node)
    _break_cycles(pairs, roots, root, parents)
    for node, _span in pairs:
        node["children"].sort(key=lambda child: child["start_ns"])
    roots.sort(key=lambda node: node["start_ns"])
    return roots, pairs


def _break_cycles(
    pairs: list[tuple[dict[str, Any], Any]],
    roots: list[dict[str, Any]],
    root: dict[str, Any] | None,
    parents: dict[int, dict[str, Any]],
) -> None:
    """Hang the earliest span of each parent cycle under ``root`` (else make it a root),
    noted ``"note": "parent cycle"``, with the spans below it.

    A node no root reaches has a parent no root reaches either: following parents from
    it ends in a cycle.
    """
    reached = _reached(roots)
    for node, _span in pairs:
        if id(node) in reached:
            continue
        seen: set[int] = set()
        current = node
        while id(current) not in seen:  # up to the cycle
            seen.add(id(current))
            current = parents[id(current)]
        cycle = [current]
        while (member := parents[id(cycle[-1])]) is not current:
            cycle.append(member)
        first = min(cycle, key=lambda n: (n["start_ns"] or 0, n["span_id"]))
        siblings = parents.pop(id(first))["children"]
        del siblings[next(i for i, child in enumerate(siblings) if child is first)]
        first["note"] = PARENT_CYCLE
        if root is not None:
            root["children"].append(first)
            parents[id(first)] = root
        else:
            roots.append(first)
        reached |= _reached([first])


def _reached(nodes: list[dict[str, Any]]) -> set[int]:
    """``id()`` of ``nodes`` and of every node below them."""
    return {id(node) for node, _depth in _walk(nodes)}


def _walk(nodes: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], int]]:
    """Each node of the trees from ``nodes``, with its depth, in order: a loop, not a
    recursion, so a tree of any depth prints."""
    stack = [(node, 0) for node in reversed(nodes)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        stack.extend((child, depth + 1) for child in reversed(node["children"]))


def _depths(roots: list[dict[str, Any]]) -> dict[int, int]:
    """Each node's depth in the tree (by ``id`` of the node)."""
    depths: dict[int, int] = {}
    stack = [(node, 0) for node in roots]
    while stack:
        node, depth = stack.pop()
        depths[id(node)] = depth
        stack.extend((child, depth + 1) for child in node["children"])
    return depths


def _select(
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


def _text(nodes: list[dict[str, Any]], evicted: int, open_as: str) -> str:
    out: list[str] = []
    if evicted:
        out.append(f"({evicted} older spans were evicted from the in-memory trace buffer)")
    for node, depth in _walk(nodes):
        out.append("  " * depth + _line(node, open_as))
    return "\n".join(out)


def placeholder(text: str, start_ns: int) -> dict[str, Any]:
    """A node that stands for spans left out of a tree (``... 99,980 steps like these ...``),
    placed among its siblings at ``start_ns``."""
    return {
        "name": "...",
        "index": None,
        "span_id": "",
        "parent_id": None,
        "start_ns": start_ns,
        "end_ns": start_ns,
        "duration_ns": 0,
        "attributes": {},
        "marks": [],
        "events": [],
        "links": [],
        "children": [],
        "placeholder": text,
    }


def text_of(nodes: list[dict[str, Any]], open_as: str = lines.OPEN_STOPPED) -> str:
    """The indented text of the trees from ``nodes`` (as ``ci.trace()`` prints them)."""
    return _text(nodes, 0, open_as)


def _line(node: dict[str, Any], open_as: str = lines.OPEN_RUNNING) -> str:
    """The span's line; a span shown out of its place says why (``(parent cycle)``)."""
    if "placeholder" in node:
        return str(node["placeholder"])
    line = lines.span_line(_NodeView(node), open_as)
    return f"{line} ({node['note']})" if node.get("note") else line


class _NodeView:
    """Lets :func:`lines.span_line` read a node like a span."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.name = node["name"]
        self.attributes = node["attributes"]
        self.start_time = node["start_ns"]
        self.end_time = node["end_ns"]
        self._marks = node["marks"]
        self._events = node["events"]
        self.status = Status(StatusCode[node.get("status") or "UNSET"])

    @property
    def events(self) -> list[Any]:
        marks = [_Event(m["name"], {semconv.MARK_VALUE: m["value"]}, m["time_ns"])
                 for m in self._marks if m["kind"] == "point"]  # fmt: skip
        others = [_Event(e["name"], e["attributes"], e["time_ns"]) for e in self._events]
        return marks + others


class _Event:
    def __init__(self, name: str, attributes: dict[str, Any], timestamp: int | None) -> None:
        self.name = name
        self.attributes = attributes
        self.timestamp = timestamp


def _frame(nodes: list[dict[str, Any]], depths: dict[int, int] | None = None) -> Any:
    """One row per span: the trees below ``nodes``, or (``depths`` given) ``nodes`` alone."""
    try:
        import pandas as pd
    except ImportError as error:
        raise ImportError(
            "ci.trace(format='df') needs pandas: pip install pandas "
            "(or pip install 'cirron-otel[test]')"
        ) from error
    rows: list[dict[str, Any]] = []
    if depths is not None:  # name= or last=: the rows of those spans, nothing below them
        for node in nodes:
            rows.append(
                {column: node.get(column) for column in DF_COLUMNS}
                | {"depth": depths.get(id(node), 0)}
            )
        return pd.DataFrame(rows, columns=DF_COLUMNS)

    for node, depth in _walk(nodes):
        rows.append({column: node.get(column) for column in DF_COLUMNS} | {"depth": depth})
    return pd.DataFrame(rows, columns=DF_COLUMNS)


def _check(format: str, name: str | None, last: int | None) -> None:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last < 0):
        raise ValueError(f"last must be a non-negative int, got {last!r}")


def render(
    rec: Recorder | None, format: str = "text", name: str | None = None, last: int | None = None
) -> Any:
    """``ci.trace()``: the recorder's spans from memory, under its session."""
    _check(format, name, last)
    if rec is None or rec.store is None:
        return _render([], [], format, name, last, single=True)
    if rec.processor is not None:
        rec.processor.build_noted()  # hook spans still waiting for the flush thread
    # In the order they ended (hook spans built on the flush thread reach the store late).
    spans = sorted(rec.store.ended_spans(), key=_end_time) + rec.store.open_spans()
    session = rec.session  # (a sampler may have dropped it: a span that records nothing)
    root_id = _hex(session.get_span_context().span_id) if session is not None else None
    roots, pairs = _tree(spans, root_id)
    return _render(roots, pairs, format, name, last, single=True, evicted=rec.store.evicted)


def _end_time(span: Any) -> int:
    return span.end_time if span.end_time is not None else 2**63


def render_spans(
    spans: list[Any], format: str = "text", name: str | None = None, last: int | None = None
) -> Any:
    """The same read-back for spans read from elsewhere (a spool): one tree per process.

    ``format="dict"`` gives the list of root nodes (a ``cirron.session`` per
    process), even with ``name=`` and ``last=`` unset.
    """
    _check(format, name, last)
    ended = sorted(spans, key=_end_time)
    roots, pairs = _tree(ended, None)
    return _render(roots, pairs, format, name, last, single=False)


class _Raw(str):
    """JSON text to write as it is."""


def _json(value: Any) -> str:
    """``json.dumps`` of nodes (a node, a list of them, or None), node by node with a stack:
    a tree of any depth. Bytes (an OTLP ``bytesValue``) as hex, as the Chrome export has them."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item)
        elif isinstance(item, list):  # of nodes: "[", the first, ", ", the second, ..., "]"
            stack.append(_Raw("]"))
            for position in range(len(item) - 1, -1, -1):
                stack.append(item[position])
                if position:
                    stack.append(_Raw(", "))
            stack.append(_Raw("["))
        elif isinstance(item, dict):  # a node: its fields, then its children
            fields = {key: field for key, field in item.items() if key != "children"}
            out.append(json.dumps(fields, default=_hex_bytes)[:-1] + ', "children": ')
            stack.append(_Raw("}"))
            stack.append(item["children"])
        else:
            out.append(json.dumps(item))
    return "".join(out)


def _hex_bytes(value: Any) -> str:
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _render(
    roots: list[dict[str, Any]],
    pairs: list[tuple[dict[str, Any], Any]],
    format: str,
    name: str | None,
    last: int | None,
    *,
    single: bool,
    evicted: int = 0,
) -> Any:
    selected = _select(pairs, name, last)
    nodes = selected if selected is not None else roots
    whole: Any = roots[0] if single and roots else (None if single else roots)
    if format == "dict":
        return selected if selected is not None else whole
    if format == "json":
        return _json(selected if selected is not None else whole)
    if format == "df":
        return _frame(nodes, _depths(roots) if selected is not None else None)
    # Live, an open span is running; in a spool, its process stopped before it ended.
    text = TraceText(_text(nodes, evicted, lines.OPEN_RUNNING if single else lines.OPEN_STOPPED))
    text._nodes = nodes
    text._spans = [span for _node, span in pairs]
    return text
