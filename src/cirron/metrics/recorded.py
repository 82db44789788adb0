"""What cirron recorded as metrics, kept in memory for ``ci.metrics()``: one row per measurement.

Every value handed to an instrument is also kept here, with the time it describes (a
mark's own time, a step's end, a sample's) and the trace and span id its exemplar
carries, in a bounded deque: past :data:`CAPACITY` rows the oldest go, and are counted.
This is what the program recorded, not what a backend aggregated: a histogram's every
value, not its buckets.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

CAPACITY = 25_000  # rows kept: about 5 MB at most (a loss and a step's figures, ~3,000 steps)
MAX_SETS = 10_000  # distinct attribute sets numbered; a row of another holds its pairs
FORMATS = ("df", "dict")
DF_COLUMNS = ["name", "kind", "unit", "time_ns", "value", "attributes", "trace_id", "span_id"]


class Instrument(NamedTuple):
    kind: str  # OpenTelemetry's name of the instrument: Histogram, Counter, ObservableGauge, ...
    unit: str
    description: str


class Row(NamedTuple):
    name: str
    time_ns: int
    value: float | int
    attributes: Mapping[str, Any]
    trace_id: int  # 0: no span (a system sample)
    span_id: int


FIELDS = len(Row._fields)  # a row's values, side by side in Recorded's one deque


_MAX_FIXED = 64  # add_many()'s attribute dicts known by identity (a step's parts: 5)


class Recorded:
    """The measurements of one profiler, newest last.

    A row is no object of its own while it is held: its six values (a :class:`Row`'s
    fields, its attributes the number of their set in :attr:`sets`) lie side by side in one
    deque, and rows are made when read (:meth:`snapshot`). Each object a measurement kept
    alive would count toward the garbage collector's next pass (the collector runs after
    every ~700 objects allocated and not yet freed, on whichever thread allocates next):
    the rows of a step's figures, kept for thousands of steps, were a quarter of what
    brought its passes on in a torch loop. Held as tuples, they also stayed tracked (a tuple
    that holds a dict or another tuple still tracked, and a named tuple, are never
    untracked), and every row that outlived two passes brought the next full collection
    nearer, which in a torch process walks every object torch made (~0.1-0.25 s).

    A row goes in with one ``extend`` of its six values, which no other thread interleaves
    (the deque's C code runs it whole), so the rows of the sink's and the sampler's threads
    never mix; the deque's bound is a whole number of rows, so the oldest go whole too.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._values: collections.deque[Any] = collections.deque(maxlen=capacity * FIELDS)
        self.instruments: dict[str, Instrument] = {}
        # The distinct attribute sets, as pairs, and their numbers (a few dozen in a run:
        # an instrument's attributes are few by design). Past MAX_SETS, a row holds its pairs.
        self.sets: dict[tuple[tuple[str, Any], ...], int] = {}
        self._listed: list[tuple[tuple[str, Any], ...]] = []
        self._sets_lock = threading.Lock()
        self._added = itertools.count()
        self._extended = 0  # rows added by add_many() (the metrics sink's thread only)
        self._fixed: dict[int, tuple[Mapping[str, Any], Any]] = {}  # add_many()'s sets

    def __len__(self) -> int:
        """Rows held now."""
        return len(self._values) // FIELDS

    def describe(self, name: str, kind: str, unit: str, description: str) -> None:
        self.instruments[name] = Instrument(kind, unit, description)

    def _set_of(self, attributes: Mapping[str, Any]) -> Any:
        """What a row holds of ``attributes``: the number of their set, or past MAX_SETS the
        pairs themselves."""
        pairs = tuple(attributes.items()) if attributes else ()
        try:
            number = self.sets.get(pairs)
        except TypeError:  # a list among the values: a sequence attribute, as a tuple
            pairs = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in pairs)
            number = self.sets.get(pairs)
        if number is None:
            number = self._number(pairs)
        return pairs if number is None else number

    def _number(self, pairs: tuple[tuple[str, Any], ...]) -> int | None:
        """The number of a new attribute set (from any thread); None past MAX_SETS."""
        with self._sets_lock:
            number = self.sets.get(pairs)
            if number is None and len(self._listed) < MAX_SETS:
                number = len(self._listed)
                self._listed.append(pairs)
                self.sets[pairs] = number
            return number

    def add(
        self,
        name: str,
        time_ns: int,
        value: float | int,
        attributes: Mapping[str, Any],
        trace_id: int = 0,
        span_id: int = 0,
    ) -> None:
        # From the sink's and the sampler's threads, with no lock: the deque's extend and a
        # count's next are atomic.
        self._values.extend((name, time_ns, value, self._set_of(attributes), trace_id, span_id))
        next(self._added)

    def add_many(
        self,
        name: str,
        time_ns: int,
        values: list[tuple[float | int, Mapping[str, Any]]],
        trace_id: int = 0,
        span_id: int = 0,
    ) -> None:
        """A row of ``name`` for each (value, attributes) in ``values``, all of one time and
        span, at once (the metrics sink's, only: its count is not atomic). Each ``attributes``
        is one of a few dicts that never change (a step's part): what a row holds of it is
        looked up by identity once it is known."""
        flat: list[Any] = []
        fixed = self._fixed
        for value, attributes in values:
            known = fixed.get(id(attributes))
            if known is None:  # (the entry holds the dict: its id is never another's)
                known = (attributes, self._set_of(attributes))
                if len(fixed) < _MAX_FIXED:
                    fixed[id(attributes)] = known
            flat += (name, time_ns, value, known[1], trace_id, span_id)
        self._values.extend(flat)
        self._extended += len(values)

    @property
    def evicted(self) -> int:
        """Rows dropped to keep :data:`CAPACITY` (the oldest)."""
        added = int(repr(self._added)[6:-1])  # count(5) -> 5; reading never advances it
        return max(0, added + self._extended - len(self))

    def snapshot(self) -> list[Row]:
        held, listed = self._copy(), self._listed
        return [
            Row(name, time_ns, value, dict(listed[a] if type(a) is int else a), trace, span)
            for name, time_ns, value, a, trace, span in zip(
                *(held[field::FIELDS] for field in range(FIELDS)), strict=True
            )
        ]

    def values(self) -> list[tuple[str, float | int]]:
        """Each row's name and value, oldest first, with no row made (the run's summary)."""
        held = self._copy()
        return list(zip(held[0::FIELDS], held[2::FIELDS], strict=True))

    def _copy(self) -> list[Any]:
        while True:
            try:
                return list(self._values)
            except RuntimeError:  # a row came in while copying: copy again
                continue


def _hex(value: int, width: int) -> str | None:
    return format(value, f"0{width}x") if value else None


def _as_dict(row: Row) -> dict[str, Any]:
    return {
        "time_ns": row.time_ns,
        "value": row.value,
        "attributes": dict(row.attributes),
        "trace_id": _hex(row.trace_id, 32),
        "span_id": _hex(row.span_id, 16),
    }


def render(recorded: Recorded | None, format: str = "df") -> Any:
    """``ci.metrics()``: ``df`` a DataFrame, one row per measurement (:data:`DF_COLUMNS`);
    ``dict`` per instrument name, ``{"kind", "unit", "description", "points": [...]}``."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    rows = recorded.snapshot() if recorded is not None else []
    instruments = recorded.instruments if recorded is not None else {}
    if format == "dict":
        found: dict[str, Any] = {}
        for row in rows:
            kind, unit, description = instruments.get(row.name, Instrument("", "", ""))
            entry = found.setdefault(
                row.name, {"kind": kind, "unit": unit, "description": description, "points": []}
            )
            entry["points"].append(_as_dict(row))
        return found
    try:
        import pandas as pd
    except ImportError as error:
        raise ImportError(
            "ci.metrics(format='df') needs pandas: pip install pandas, or use format='dict'"
        ) from error
    records = []
    for row in rows:
        instrument = instruments.get(row.name, Instrument("", "", ""))
        records.append(
            {"name": row.name, "kind": instrument.kind, "unit": instrument.unit} | _as_dict(row)
        )
    return pd.DataFrame(records, columns=DF_COLUMNS)
