"""OTLP export with the official OpenTelemetry exporters.

On whenever an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), independent of ``output=``. The
protocol comes from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf`` or ``grpc``. Unset, the
endpoint says which (:func:`endpoint_protocol`: port 4317 is gRPC, port 4318
or a ``/v1/traces`` path OTLP/HTTP), else ``http/protobuf`` (the OTel
default). Endpoint, headers, timeout, TLS and compression are read by the
official exporter from the standard variables. Its log lines about failed
exports are kept to the first of each kind (:class:`RepeatFilter`).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExporter

from ..otel import environment as env
from .sinks import SINK_THREAD_PREFIX

_log = logging.getLogger("cirron")
PROTOCOLS = ("http/protobuf", "grpc")
# Loggers of the official exporters and their HTTP transports.
_EXPORTER_LOGGERS = ("opentelemetry.exporter", "urllib3.connectionpool")


# The ports OTLP receivers listen on (the OTLP specification's defaults).
_PROTOCOL_OF_PORT = {4317: "grpc", 4318: "http/protobuf"}


def endpoint_configured() -> bool:
    return configured_endpoint() is not None


def chosen_protocol() -> str:
    """The protocol the variables set (the traces one first), or ''."""
    return (
        os.environ.get(env.EXPORTER_OTLP_TRACES_PROTOCOL, "").strip()
        or os.environ.get(env.EXPORTER_OTLP_PROTOCOL, "").strip()
    )


def configured_endpoint() -> tuple[str, str] | None:
    """(variable, endpoint) of the traces endpoint, the traces variable first, as the
    exporters read them; None when neither is set."""
    for variable in (env.EXPORTER_OTLP_TRACES_ENDPOINT, env.EXPORTER_OTLP_ENDPOINT):
        endpoint = os.environ.get(variable, "").strip()
        if endpoint:
            return variable, endpoint
    return None


def endpoint_protocol() -> str | None:
    """The protocol the configured endpoint stands for, or None when it says neither."""
    configured = configured_endpoint()
    return protocol_of(configured[1], "/v1/traces") if configured is not None else None


def protocol_of(endpoint: str, signal_path: str) -> str | None:
    """The protocol ``endpoint`` stands for, or None when it says neither.

    Port 4317 is gRPC; port 4318, or a path that ends in ``signal_path`` (``/v1/traces``;
    only OTLP/HTTP has paths), is ``http/protobuf``.
    """
    try:
        parts = urlsplit(endpoint if "//" in endpoint else "//" + endpoint)
        port = parts.port
    except ValueError:  # not a URL the exporter could use either: it will say so
        return None
    if parts.path.rstrip("/").endswith(signal_path):
        return "http/protobuf"
    return _PROTOCOL_OF_PORT.get(port) if port is not None else None


def protocol() -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``; unset, the one
    of the endpoint's port or path (:func:`endpoint_protocol`), else ``http/protobuf``."""
    chosen = chosen_protocol() or endpoint_protocol() or "http/protobuf"
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
    are not filtered. A message is kept once whichever exporter logs it: the
    traces' and the metrics' exporters tell of the same backend in the same words.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, Any]] = set()
        self.suppressed = 0

    def reset(self) -> None:
        self._seen = set()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        on_ours = threading.current_thread().name.startswith(SINK_THREAD_PREFIX)
        if not on_ours and not getattr(_exporting, "ours", False):
            return True
        # The logger's package, less the signal: ...http.trace_exporter and
        # ...http.metric_exporter are one exporter of the same backend.
        key = (record.name.rpartition(".")[0] if record.name.endswith("_exporter") else record.name,
               record.msg)  # fmt: skip
        if key in self._seen:
            self.suppressed += 1
            return False
        self._seen.add(key)
        return True


repeat_filter = RepeatFilter()
# Set while one of cirron's exporters runs on a thread that is not a sink's (the SDK's metric
# reader thread): its log lines are filtered as a sink thread's are (see quiet_exports).
_exporting = threading.local()


class quiet_exports:
    """``with quiet_exports():`` the exporters' repeated log lines on this thread are kept to
    the first of each, as on a sink thread (for cirron's exporters run by the SDK's threads)."""

    def __enter__(self) -> None:
        self._was = getattr(_exporting, "ours", False)
        _exporting.ours = True

    def __exit__(self, *exc: Any) -> None:
        _exporting.ours = self._was


def quiet_exporter_loggers() -> None:
    """Put :data:`repeat_filter` on every logger of the OpenTelemetry exporters."""
    repeat_filter.reset()
    filter_loggers(_EXPORTER_LOGGERS, repeat_filter)


def filter_loggers(prefixes: str | tuple[str, ...], log_filter: logging.Filter) -> None:
    """Put ``log_filter`` on each logger whose name begins with one of ``prefixes`` (a
    filter acts on its own logger's records only, so each logger that exists gets it)."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if (
            name.startswith(prefixes)
            and isinstance(logger, logging.Logger)
            and log_filter not in logger.filters
        ):
            logger.addFilter(log_filter)


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
    quiet_exporter_loggers()  # after the import: the exporters' loggers exist now
    return exporter


def traces_endpoint() -> str:
    """Where the OTLP sink sends, as the official exporters resolve it from the environment:
    the traces endpoint as given, else the general one (with ``/v1/traces`` over HTTP), else
    the default of the protocol."""
    traces = os.environ.get(env.EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
    if traces:
        return traces
    general = os.environ.get(env.EXPORTER_OTLP_ENDPOINT, "").strip()
    if protocol() == "grpc":
        return general or "http://localhost:4317"
    return (general or "http://localhost:4318").rstrip("/") + "/v1/traces"
