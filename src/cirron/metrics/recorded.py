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


class Recorded:
    """The measurements of one profiler, newest last.

    Held as flat tuples of plain values (:meth:`held`: a :class:`Row`'s fields, its
    attributes the number of their set in :attr:`sets`), and made rows when read
    (:meth:`snapshot`). The garbage collector stops tracking a tuple of plain values at its
    first pass, but never a named tuple, nor a tuple that holds a dict or another tuple it
    still tracks (a row's attributes as pairs were one, often: made before their pairs, or
    shared by many rows and long since promoted). Tracked, the rows that outlive two passes
    (most of them: they stay for thousands of steps) count toward the next full collection,
    which in a torch process walks every object torch made (~0.1-0.25 s): a full pass every
    ~5,000 steps of a small MLP, half of it for these rows.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.rows: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=capacity)
        self.instruments: dict[str, Instrument] = {}
        # The distinct attribute sets, as pairs, and their numbers (a few dozen in a run:
        # an instrument's attributes are few by design). Past MAX_SETS, a row holds its pairs.
        self.sets: dict[tuple[tuple[str, Any], ...], int] = {}
        self._listed: list[tuple[tuple[str, Any], ...]] = []
        self._sets_lock = threading.Lock()
        self._added = itertools.count()
        self._extended = 0  # rows added by extend() (the metrics sink's thread only)

    def describe(self, name: str, kind: str, unit: str, description: str) -> None:
        self.instruments[name] = Instrument(kind, unit, description)

    def held(
        self,
        name: str,
        time_ns: int,
        value: float | int,
        attributes: Mapping[str, Any],
        trace_id: int = 0,
        span_id: int = 0,
    ) -> tuple[Any, ...]:
        """A row as it is held (see the class)."""
        pairs = tuple(attributes.items()) if attributes else ()
        try:
            number = self.sets.get(pairs)
        except TypeError:  # a list among the values: a sequence attribute, as a tuple
            pairs = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in pairs)
            number = self.sets.get(pairs)
        if number is None:
            number = self._number(pairs)
        return (name, time_ns, value, pairs if number is None else number, trace_id, span_id)

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
        # From the sink's and the sampler's threads, with no lock: a deque's append and a
        # count's next are atomic.
        self.rows.append(self.held(name, time_ns, value, attributes, trace_id, span_id))
        next(self._added)

    def extend(self, rows: list[tuple[Any, ...]]) -> None:
        """Several rows at once (the metrics sink's, only: its count is not atomic)."""
        self.rows.extend(rows)
        self._extended += len(rows)

    @property
    def evicted(self) -> int:
        """Rows dropped to keep :data:`CAPACITY` (the oldest)."""
        added = int(repr(self._added)[6:-1])  # count(5) -> 5; reading never advances it
        return max(0, added + self._extended - len(self.rows))

    def snapshot(self) -> list[Row]:
        listed = self._listed
        return [
            Row(n, t, v, dict(listed[a] if type(a) is int else a), trace, span)
            for n, t, v, a, trace, span in self._copy()
        ]

    def values(self) -> list[tuple[str, float | int]]:
        """Each row's name and value, oldest first, with no row made (the run's summary)."""
        return [(row[0], row[2]) for row in self._copy()]

    def _copy(self) -> list[tuple[Any, ...]]:
        while True:
            try:
                return list(self.rows)
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
