"""OTLP export with the official OpenTelemetry exporters.

On whenever an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), independent of ``output=``. The
protocol comes from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` (the OTel default) or
``grpc``. Endpoint, headers, timeout, TLS and compression are read by the
official exporter from the standard variables.
"""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.trace.export import SpanExporter

from .. import environment as env

_log = logging.getLogger("cirron")
PROTOCOLS = ("http/protobuf", "grpc")


def endpoint_configured() -> bool:
    return bool(
        os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
        or os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
    )


def protocol() -> str:
    chosen = (
        os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "").strip()
        or os.environ.get(env.OTEL_EXPORTER_OTLP_PROTOCOL, "").strip()
        or "http/protobuf"
    )
    if chosen not in PROTOCOLS:
        _log.warning(
            "cirron: OTLP protocol %r is not supported (use %s); using http/protobuf",
            chosen,
            " or ".join(PROTOCOLS),
        )
        return "http/protobuf"
    return chosen


def otlp_exporter() -> SpanExporter:
    if protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()
