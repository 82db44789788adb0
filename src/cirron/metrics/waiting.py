"""The ended spans the metrics sink holds for a batch, as columns: a few fields of each.

Every span of the run passes through here, and most of them (a user's scope, a span of
another library) give no figure: they only wait, in case a part span inside them arrives
late. So a span is held as an entry in each of a few lists (its end, name, ids, duration),
not as an object of its own: a tuple a span cost the sink more in the garbage collector's
passes (each object it makes is one more to scan while it lives) than in its own work.
Names and ints are not scanned, and the lists grow in place.

The span itself is kept only for the spans a figure is read from (a step, a batch, an
epoch: its attributes and its context, the exemplar); the others' entry is None.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

# One held span's fields, in the order of the columns.
Fields = tuple[int, str, int, "int | None", int, "ReadableSpan | None"]


class Waiting:
    """Ended spans in columns; sorted by end (:meth:`sort`) before they are taken."""

    __slots__ = ("end", "name", "span_id", "parent_id", "duration", "span")

    def __init__(self) -> None:
        self.end: list[int] = []
        self.name: list[str] = []
        self.span_id: list[int] = []
        self.parent_id: list[int | None] = []
        self.duration: list[int] = []
        self.span: list[ReadableSpan | None] = []  # a step's, a batch's or an epoch's

    def __len__(self) -> int:
        return len(self.end)

    def add(
        self,
        end: int,
        name: str,
        span_id: int,
        parent_id: int | None,
        duration: int,
        span: ReadableSpan | None,
    ) -> None:
        self.end.append(end)
        self.name.append(name)
        self.span_id.append(span_id)
        self.parent_id.append(parent_id)
        self.duration.append(duration)
        self.span.append(span)

    def appends(self) -> tuple[Callable[[Any], None], ...]:
        """Each column's ``append``, in :meth:`add`'s order: for a loop that adds many (a call
        less a span). Append to all of them, or to none."""
        return tuple(column.append for column in self._columns())

    def _columns(self) -> tuple[list[Any], ...]:
        return (self.end, self.name, self.span_id, self.parent_id, self.duration, self.span)

    def sort(self) -> None:
        """By end, stably: spans that ended at once keep the order they came in."""
        end = self.end
        if end == sorted(end):  # the common case: spans reach the sink in the order they end
            return
        order = sorted(range(len(end)), key=end.__getitem__)
        for column in self._columns():
            column[:] = [column[position] for position in order]

    def take_until(self, cutoff: int | None = None) -> Waiting:
        """The spans (sorted) that ended by ``cutoff`` (None: all), taken out of these."""
        split = len(self.end) if cutoff is None else bisect.bisect_right(self.end, cutoff)
        taken = Waiting()
        for mine, theirs in zip(self._columns(), taken._columns(), strict=True):
            theirs[:] = mine[:split]
            del mine[:split]
        return taken

    def __iter__(self) -> Iterator[Fields]:
        return zip(*self._columns(), strict=True)
