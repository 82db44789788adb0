"""The bounded in-memory store behind ``ci.trace()``.

It sees every span twice: when it starts (kept as open, so read-back can show
what is running and signal handlers can close it) and when it ends (kept in a
bounded deque; the oldest are evicted and counted once it is full).
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

from .health import _value
from .spans import ScopeSpan


class TraceStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ended: collections.deque[Any] = collections.deque(maxlen=capacity)
        self.open: dict[int, Any] = {}  # by span id; the processor adds to it
        self._evicted = itertools.count()

    # Spans are added to `open` by the processor's on_start (inline, it is the hot path).
    def ended(self, span: Any) -> None:
        self.open.pop(span._span_id if type(span) is ScopeSpan else span.context.span_id, None)
        ended = self._ended
        if len(ended) == self.capacity:
            next(self._evicted)
        ended.append(span)

    @property
    def evicted(self) -> int:
        return _value(self._evicted)

    def open_spans(self) -> list[Any]:
        """Open spans, oldest first (a copy: safe while other threads record)."""
        while True:
            try:
                return list(self.open.values())
            except RuntimeError:  # dict resized by another thread during the copy
                continue

    def ended_spans(self) -> list[Any]:
        """Ended spans in the order they ended (a copy)."""
        while True:
            try:
                return list(self._ended)
            except RuntimeError:  # deque mutated by another thread during the copy
                continue

    def clear(self) -> None:
        self.open.clear()
        self._ended.clear()
