"""OTLP export with the official OpenTelemetry exporters.

On whenever an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), independent of ``output=``. The
protocol comes from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` (the OTel default) or
``grpc``. Endpoint, headers, timeout, TLS and compression are read by the
official exporter from the standard variables. Its log lines about failed
exports are kept to the first of each kind (:class:`RepeatFilter`).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from ..otel import environment as env
from .sinks import SINK_THREAD_PREFIX

_log = logging.getLogger("cirron")
PROTOCOLS = ("http/protobuf", "grpc")
# Loggers of the official exporters and their HTTP transports.
_EXPORTER_LOGGERS = ("opentelemetry.exporter", "urllib3.connectionpool")


def endpoint_configured() -> bool:
    return bool(
        os.environ.get(env.EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
        or os.environ.get(env.EXPORTER_OTLP_ENDPOINT, "").strip()
    )


def protocol() -> str:
    chosen = (
        os.environ.get(env.EXPORTER_OTLP_TRACES_PROTOCOL, "").strip()
        or os.environ.get(env.EXPORTER_OTLP_PROTOCOL, "").strip()
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


class RepeatFilter(logging.Filter):
    """Lets through the first record of each message the exporters log from a sink thread.

    The official exporters log every failed export (and every retry) at
    WARNING/ERROR: with a backend down for a day, that is thousands of lines.
    cirron's sink threads keep the first of each (it says why: refused, 503,
    unauthorized), drop the repeats and count them; cirron's own warning and
    ``ci.health()`` say the rest. The user's own exporters, on other threads,
    are not filtered.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, Any]] = set()
        self.suppressed = 0

    def reset(self) -> None:
        self._seen = set()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not threading.current_thread().name.startswith(SINK_THREAD_PREFIX):
            return True
        key = (record.name, record.msg)
        if key in self._seen:
            self.suppressed += 1
            return False
        self._seen.add(key)
        return True


repeat_filter = RepeatFilter()


def _quiet_exporter_loggers() -> None:
    """Put :data:`repeat_filter` on every logger of the OpenTelemetry exporters."""
    repeat_filter.reset()
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if (
            name.startswith(_EXPORTER_LOGGERS)
            and isinstance(logger, logging.Logger)
            and repeat_filter not in logger.filters
        ):
            logger.addFilter(repeat_filter)


def otlp_exporter() -> SpanExporter:
    exporter: SpanExporter
    if protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter = GrpcExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter()
    _quiet_exporter_loggers()  # after the import: the exporters' loggers exist now
    return exporter
