"""The spool's metrics: OTLP/JSON ``ExportMetricsServiceRequest`` files, and the one reader of them.

Files are ``<path>/metrics/<pid>-<sequence>.json``, beside the span spool (``<path>/spool/``)
but not in it, so a reader of spans never meets a metrics file. Each file is written whole
(:mod:`cirron.exporters.files`) and holds the collections of up to :data:`WRITE_EVERY`
seconds, one ``resourceMetrics`` entry per collection, oldest first; ``ci.flush()`` and the
end of the run write what is pending. The encoding is OTLP/JSON's: lowerCamelCase keys,
enums as integers, 64-bit integers as strings, and exemplar trace and span ids as hex (the
protobuf JSON mapping would write them in base64, which OTLP/JSON forbids).

Temporality is delta: each collection holds what happened since the one before (a
counter's increase, a histogram of that interval's values, each gauge's latest sample), so
a file reads as a stretch of a time series, and an interval in which nothing was recorded
adds only the gauges. :func:`read_metrics` turns the files back into one flat list of points,
what the report draws utilisation and memory over time from.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from typing import Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

from . import files

_log = logging.getLogger("cirron")
WRITE_EVERY = 10.0  # seconds of collections a file holds at most
FOLDER = "metrics"
_DELTA = {
    Counter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
    ObservableCounter: AggregationTemporality.DELTA,
    UpDownCounter: AggregationTemporality.CUMULATIVE,  # a level, not an increase
    ObservableUpDownCounter: AggregationTemporality.CUMULATIVE,
    ObservableGauge: AggregationTemporality.CUMULATIVE,
}
_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")


def encode_metrics_json(metrics_data: MetricsData) -> dict[str, Any]:
    """``metrics_data`` as an OTLP/JSON ``ExportMetricsServiceRequest`` dict (ids in hex)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    request = MessageToDict(encode_metrics(metrics_data), use_integers_for_enums=True)
    for metric in _metrics_of(request):
        for kind in _KINDS:
            for point in metric.get(kind, {}).get("dataPoints", []):
                for exemplar in point.get("exemplars", []):
                    for key in ("traceId", "spanId"):
                        if key in exemplar:
                            exemplar[key] = base64.b64decode(exemplar[key]).hex()
    request.setdefault("resourceMetrics", [])
    return request


def _metrics_of(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        metric
        for resource_metrics in request.get("resourceMetrics", [])
        for scope_metrics in resource_metrics.get("scopeMetrics", [])
        for metric in scope_metrics.get("metrics", [])
    ]


class MetricsFileExporter(MetricExporter):
    """Writes the collections of a metric reader as OTLP/JSON files under ``<path>/metrics/``.

    A child process (a DataLoader worker forked with the reader) writes nothing: what it
    would collect is its parent's.
    """

    def __init__(self, path: str, write_every: float = WRITE_EVERY) -> None:
        super().__init__(preferred_temporality=_DELTA)  # type: ignore[arg-type]
        self.directory = os.path.join(path, FOLDER)
        self.write_every = write_every
        self.files_written = 0
        self.errors = 0  # writes that failed; the first is warned about
        self._pending: list[dict[str, Any]] = []
        self._written_at = time.monotonic()
        self._sequence = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        try:
            collected = encode_metrics_json(metrics_data)["resourceMetrics"]
            with self._lock:
                self._pending.extend(collected)
                if time.monotonic() - self._written_at >= self.write_every:
                    self._write()
        except Exception as error:  # noqa: BLE001 - a failed file never reaches the program
            self._failed(error)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def _failed(self, error: BaseException) -> None:
        """Count a failed write; the first is told, unless the disk refused it: the files are
        written beside the spool's, whose sink says so in its one warning (where, and why)."""
        self.errors += 1
        if self.errors == 1 and not isinstance(error, OSError):
            _log.warning(
                "cirron: a metrics file could not be written (%s); training continues, "
                "later failures are only counted (ci.health()['metrics']['file_errors'])",
                type(error).__name__,
            )

    def _write(self) -> None:
        """Write what is pending as one file (call with the lock held)."""
        self._written_at = time.monotonic()
        if not self._pending:
            return
        data = json.dumps({"resourceMetrics": self._pending}, separators=(",", ":"))
        self._pending = []
        files.make_directory(self.directory)
        pid = os.getpid()
        while True:  # never replace a file: an earlier profiler of this process may have written it
            self._sequence += 1
            final = os.path.join(self.directory, f"{pid}-{self._sequence:06d}.json")
            if not os.path.exists(final):
                break
        files.write_whole(final, data.encode("ascii"))
        self.files_written += 1

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        if os.getpid() != self._pid:
            return True
        try:
            with self._lock:
                self._write()
        except Exception as error:  # noqa: BLE001
            self._failed(error)
            return False
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.force_flush()


# -- reading --------------------------------------------------------------------------------------


def metrics_files(path: str = ".cirron") -> list[str]:
    """The metrics files at ``path`` (a cirron directory, its ``metrics`` folder or one file),
    in (process, sequence) order."""
    if os.path.isfile(path):
        return [path]
    folder = (
        path if os.path.basename(os.path.normpath(path)) == FOLDER else os.path.join(path, FOLDER)
    )
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        stem, _, suffix = name.partition(".")
        pid, _, sequence = stem.partition("-")
        if suffix == "json" and pid.isdigit() and sequence.isdigit():
            found.append(((int(pid), int(sequence)), os.path.join(folder, name)))
    return [name for _order, name in sorted(found)]


def _value(any_value: dict[str, Any]) -> Any:
    """An OTLP/JSON ``AnyValue`` as Python."""
    if "stringValue" in any_value:
        return any_value["stringValue"]
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "doubleValue" in any_value:
        return float(any_value["doubleValue"])
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    return None


def _attributes(pairs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {pair["key"]: _value(pair.get("value", {})) for pair in pairs or []}


def _number(point: dict[str, Any]) -> float | int | None:
    if "asInt" in point:
        return int(point["asInt"])
    if "asDouble" in point:
        return float(point["asDouble"])
    return None


def _point(metric: dict[str, Any], kind: str, point: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": metric.get("name", ""),
        "unit": metric.get("unit", ""),
        "kind": kind,
        "attributes": _attributes(point.get("attributes")),
        "start_ns": int(point.get("startTimeUnixNano", 0)),
        "time_ns": int(point.get("timeUnixNano", 0)),
        "exemplars": [
            {
                "trace_id": exemplar.get("traceId"),
                "span_id": exemplar.get("spanId"),
                "value": _number(exemplar),
                "time_ns": int(exemplar.get("timeUnixNano", 0)),
                "attributes": _attributes(exemplar.get("filteredAttributes")),
            }
            for exemplar in point.get("exemplars", [])
        ],
    }
    if kind == "histogram":
        count = int(point.get("count", 0))
        total = float(point.get("sum", 0.0))
        found.update(
            count=count,
            sum=total,
            min=point.get("min"),
            max=point.get("max"),
            bounds=[float(b) for b in point.get("explicitBounds", [])],
            bucket_counts=[int(c) for c in point.get("bucketCounts", [])],
            value=total / count if count else None,  # the interval's mean
        )
    else:
        found["value"] = _number(point)
    return found


def read_metrics(path: str = ".cirron") -> list[dict[str, Any]]:
    """Every data point of the metrics files at ``path``, oldest file first, as flat dicts.

    ``path`` is a cirron directory, its ``metrics`` folder or one file. Each point:
    ``name``, ``unit``, ``kind`` (``gauge``, ``sum`` or ``histogram``), ``attributes``,
    ``start_ns`` and ``time_ns`` (the interval it covers), ``value`` (a gauge's or sum's
    value; a histogram's mean over the interval), for histograms also ``count``, ``sum``,
    ``min``, ``max``, ``bounds`` and ``bucket_counts``, ``exemplars`` (each ``trace_id`` and
    ``span_id`` in hex, ``value``, ``time_ns``, ``attributes``), and ``resource`` (the
    resource's attributes). A file that does not read is left out, with one warning on
    the ``cirron`` logger.
    """
    points: list[dict[str, Any]] = []
    for name in metrics_files(path):
        try:
            with open(name, encoding="ascii") as stream:
                request = json.load(stream)
            found = []
            for resource_metrics in request.get("resourceMetrics", []):
                resource = _attributes(resource_metrics.get("resource", {}).get("attributes"))
                for scope_metrics in resource_metrics.get("scopeMetrics", []):
                    for metric in scope_metrics.get("metrics", []):
                        for kind in _KINDS:
                            for point in metric.get(kind, {}).get("dataPoints", []):
                                found.append(_point(metric, kind, point) | {"resource": resource})
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as error:
            _log.warning("cirron: %s: not a readable metrics file (%s)", name, error)
            continue
        points.extend(found)
    return points
