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
        self.ended_deque: collections.deque[Any] = collections.deque(maxlen=capacity)
        self.open: dict[int, Any] = {}  # by span id; the processor adds to it
        self.evictions = itertools.count()  # next() per evicted span: atomic, lock-free

    # The processor's on_start and on_end do this inline (the hot path); keep them alike.
    def ended(self, span: Any) -> None:
        self.open.pop(span._span_id if type(span) is ScopeSpan else span.context.span_id, None)
        ended = self.ended_deque
        if len(ended) == self.capacity:
            next(self.evictions)
        ended.append(span)

    @property
    def evicted(self) -> int:
        return _value(self.evictions)

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
                return list(self.ended_deque)
            except RuntimeError:  # deque mutated by another thread during the copy
                continue

    def clear(self) -> None:
        self.open.clear()
        self.ended_deque.clear()
