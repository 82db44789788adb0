"""OTLP metrics with the official OpenTelemetry exporters: the traces' rules, read for metrics.

On whenever an endpoint for metrics is configured: ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (an endpoint for traces only is not one). The protocol
is ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL``, then ``OTEL_EXPORTER_OTLP_PROTOCOL``; unset,
the endpoint says which (port 4317 is gRPC, port 4318 or a ``/v1/metrics`` path OTLP/HTTP),
else ``http/protobuf``, as for traces (:mod:`cirron.exporters.otlp`). Headers, timeout,
TLS, compression and temporality (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``)
are read by the official exporter. Its repeated log lines about failed exports are kept
to the first of each, as the span sink's are.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from ..otel import environment as env
from .otlp import PROTOCOLS, protocol_of, quiet_exporter_loggers, quiet_exports

_log = logging.getLogger("cirron")


def metrics_endpoint() -> tuple[str, str] | None:
    """(variable, endpoint) of the metrics endpoint, the metrics variable first; None: unset."""
    for variable in (env.EXPORTER_OTLP_METRICS_ENDPOINT, env.EXPORTER_OTLP_ENDPOINT):
        endpoint = os.environ.get(variable, "").strip()
        if endpoint:
            return variable, endpoint
    return None


def metrics_endpoint_configured() -> bool:
    return metrics_endpoint() is not None


def _endpoint_protocol() -> str | None:
    configured = metrics_endpoint()
    return protocol_of(configured[1], "/v1/metrics") if configured is not None else None


def metrics_protocol() -> str:
    """The protocol of OTLP metrics: the variables, else the endpoint's, else ``http/protobuf``."""
    chosen = (
        os.environ.get(env.EXPORTER_OTLP_METRICS_PROTOCOL, "").strip()
        or os.environ.get(env.EXPORTER_OTLP_PROTOCOL, "").strip()
        or _endpoint_protocol()
        or "http/protobuf"
    )
    if chosen not in PROTOCOLS:
        _log.warning(
            "cirron: OTLP protocol %r is not supported for metrics (use %s); using http/protobuf",
            chosen,
            " or ".join(PROTOCOLS),
        )
        return "http/protobuf"
    return chosen


def otlp_metric_exporter() -> MetricExporter:
    """The official OTLP metric exporter for :func:`metrics_protocol`, quiet on repeats and
    silent in a forked child (whose figures are its parent's)."""
    if metrics_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as Official,
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter as Official,
        )

    class QuietOTLPMetricExporter(Official):  # type: ignore[misc, valid-type]
        """The official exporter; its log lines kept to the first of each kind."""

        _pid = os.getpid()

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            if os.getpid() != self._pid:
                return MetricExportResult.SUCCESS
            with quiet_exports():
                return super().export(metrics_data, timeout_millis, **kwargs)

    exporter = QuietOTLPMetricExporter()
    quiet_exporter_loggers()  # after the import: the exporter's loggers exist now
    return exporter
