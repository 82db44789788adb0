"""What a snapshot records per tensor: the summary adapters compute, and its span event.

An adapter summarises each tensor as ``SUMMARY_LENGTH`` numbers, in this
order: the count of finite values, the count of NaNs, the count of
infinities, the mean of the finite values, the sum of their squared
deviations from that mean (``m2``), their minimum and maximum, then the
counts of a 16-bin histogram over [minimum, maximum] (equal widths, the last
bin closed; a value ``v`` falls in bin ``floor((v - min) * 16 / (max - min))``;
when min == max every value is in the first bin). Anything that can give
those numbers (torch on CPU or GPU, NumPy for Keras) plugs in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..otel import semconv

HISTOGRAM_BINS = 16
SUMMARY_FIELDS = (
    "count",
    semconv.NAN_COUNT,
    semconv.INF_COUNT,
    semconv.MEAN,
    "m2",
    semconv.MIN,
    semconv.MAX,
)
SUMMARY_LENGTH = len(SUMMARY_FIELDS) + HISTOGRAM_BINS


class TensorRecord(NamedTuple):
    """One tensor of a snapshot, as an adapter describes it: becomes one span event."""

    name: str  # unique within the snapshot (parameter name, Keras variable path)
    kind: str  # "weight" or "gradient"
    dtype: str
    shape: tuple[int, ...]
    summary: Sequence[float]  # SUMMARY_LENGTH numbers, see the module docstring
    trainable: bool | None = None  # a weight the optimizer updates (None: not told)

    def attributes(self) -> dict[str, Any]:
        found = event_attributes(self.kind, self.dtype, self.shape, self.summary)
        if self.trainable is not None:
            found[semconv.TRAINABLE] = self.trainable
        return found


def empty_summary(nan_count: int = 0, inf_count: int = 0) -> list[float]:
    """The summary of a tensor with no finite value (empty, meta, or all NaN/inf)."""
    return [0.0, float(nan_count), float(inf_count), math.nan, math.nan, math.nan, math.nan] + [
        0.0
    ] * HISTOGRAM_BINS


def event_attributes(
    kind: str, dtype: str, shape: Sequence[int], summary: Sequence[float]
) -> dict[str, Any]:
    """A tensor event's attributes: the statistics of ``summary``, plus what it is."""
    count, nan_count, inf_count, mean, m2, low, high = (float(v) for v in summary[:7])
    if count > 0:
        variance = max(m2 / count, 0.0)  # population variance
        std, norm = math.sqrt(variance), math.sqrt(count * (variance + mean * mean))
    else:  # nothing finite to describe
        mean = std = low = high = math.nan
        norm = 0.0
    return {
        semconv.TENSOR_KIND: kind,
        semconv.DTYPE: dtype,
        semconv.SHAPE: [int(size) for size in shape],
        semconv.MEAN: mean,
        semconv.STD: std,
        semconv.MIN: low,
        semconv.MAX: high,
        semconv.NORM: norm,
        semconv.HISTOGRAM: [int(v) for v in summary[7:SUMMARY_LENGTH]],
        semconv.HISTOGRAM_RANGE: [low, high],
        semconv.NAN_COUNT: int(nan_count),
        semconv.INF_COUNT: int(inf_count),
    }
