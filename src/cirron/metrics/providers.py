"""Where cirron's metrics go: the program's ``MeterProvider``, cirron's own, or both.

A program (or ``opentelemetry-instrument``'s configurator, with ``OTEL_METRICS_EXPORTER``)
that set an SDK ``MeterProvider`` as the global one gets cirron's instruments on it: its
readers and exporters decide where they go, and cirron adds no OTLP exporter of its own.
cirron's own provider, with the traces' resource, carries its readers: OTLP when an
endpoint for metrics is configured and the program has no provider, the spool's files
when the spool is on (beside a program's provider too: the spool keeps a run's whole
record). It is never made the global provider: OpenTelemetry lets a process set that once,
and cirron's provider ends with ``ci.shutdown()``; the program's own instruments stay
where the program put them.

Flushing and shutting down run on threads of their own, bounded by a deadline: an
exporter retrying against an unreachable endpoint holds up no exit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics
from opentelemetry.sdk.metrics import (
    AlignedHistogramBucketExemplarReservoir,
    MeterProvider,
    SimpleFixedSizeExemplarReservoir,
)
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource

from ..exporters.metrics_files import MetricsFileExporter
from ..exporters.otlp_metrics import otlp_metric_exporter
from ..otel import environment as env
from ..otel.threads import daemon_thread, signals_blocked

_log = logging.getLogger("cirron")


def program_provider() -> MeterProvider | None:
    """The global SDK ``MeterProvider`` the program (or its configurator) set, if any."""
    current = metrics.get_meter_provider()
    return current if isinstance(current, MeterProvider) else None


def readers(files: MetricsFileExporter | None, otlp: bool, interval: float) -> list[MetricReader]:
    """cirron's metric readers: the spool's ``files`` and OTLP, each collecting every
    ``interval`` seconds (OTLP: ``OTEL_METRIC_EXPORT_INTERVAL`` milliseconds when set)."""
    found: list[MetricReader] = []
    with signals_blocked():  # each reader starts a thread, which leaves signals to the program
        if files is not None:
            found.append(
                PeriodicExportingMetricReader(files, export_interval_millis=interval * 1000)
            )
        if otlp:
            chosen = os.environ.get(env.METRIC_EXPORT_INTERVAL, "").strip()
            found.append(
                PeriodicExportingMetricReader(
                    otlp_metric_exporter(),
                    export_interval_millis=None if chosen else interval * 1000,
                )
            )
    return found


class LatestExemplar(SimpleFixedSizeExemplarReservoir):
    """An exemplar reservoir that keeps the latest measurement, drawing no random number.

    The SDK's default for counters and gauges draws from the global ``random`` to pick
    which measurement to keep: a seeded training run would draw other numbers with cirron
    on than off. The latest one is also the one worth following (the step just recorded).
    """

    def _find_bucket_index(self, *args: Any, **kwargs: Any) -> int:
        return 0  # (its one bucket, overwritten each time)


def _reservoir(aggregation: type) -> Any:
    """Histograms keep the SDK's reservoir (one exemplar a bucket, no draw); the rest ours."""
    if "ExplicitBucketHistogram" in aggregation.__name__:
        return AlignedHistogramBucketExemplarReservoir
    return LatestExemplar


def own_provider(metric_readers: list[MetricReader], resource: Resource) -> MeterProvider:
    """cirron's provider for ``metric_readers``, with ``resource`` (the traces')."""
    return MeterProvider(
        metric_readers=metric_readers,
        resource=resource,
        shutdown_on_exit=False,
        views=[View(instrument_name="*", exemplar_reservoir_factory=_reservoir)],
    )


def bounded(name: str, call: Callable[[], object]) -> threading.Thread:
    """Run ``call`` on a thread of its own, now; join it with a deadline (failures logged)."""

    def run() -> None:
        try:
            call()
        except Exception as error:  # noqa: BLE001 - someone's exporter never breaks the program
            _log.debug("cirron: %s failed: %s: %s", name, type(error).__name__, error)

    thread = daemon_thread(run, f"cirron-metrics-{name}")
    thread.start()
    return thread


def wait(threads: list[threading.Thread], deadline: float) -> bool:
    """Join ``threads`` until ``deadline`` (``time.monotonic()``); True when all ended."""
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)
