"""Reading a ``ci.trace(format="dict")`` tree in tests: walk it, find spans, look up and down."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

Node = dict[str, Any]


def walk(node: Node) -> Iterator[Node]:
    """``node`` and every node below it, depth first."""
    yield node
    for child in node["children"]:
        yield from walk(child)


def named(node: Node, name: str) -> list[Node]:
    """Every span called ``name`` at or below ``node``."""
    return [n for n in walk(node) if n["name"] == name]


def kids(node: Node, name: str) -> list[Node]:
    """The children of ``node`` called ``name``."""
    return [c for c in node["children"] if c["name"] == name]


def child_names(node: Node) -> Counter[str]:
    return Counter(c["name"] for c in node["children"])


def ancestors(node: Node, by_id: dict[str, Node]) -> Iterator[Node]:
    """The nodes above ``node``, innermost first (``by_id``: every node by span id)."""
    parent = by_id.get(node["parent_id"])
    while parent is not None:
        yield parent
        parent = by_id.get(parent["parent_id"])
