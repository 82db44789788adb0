"""Where spans go: the local sinks (``spool``, ``log``, ``stdout``) and OTLP.

Each exporter is a standard OpenTelemetry ``SpanExporter``, so they also work
with a plain SDK ``BatchSpanProcessor``.
"""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter

from .console import LogExporter, StdoutExporter
from .otlp import endpoint_configured, otlp_exporter
from .spool import SpoolExporter, ZeroCodeSpoolExporter, read_spool, spool_files, spool_spans
from .undelivered import UndeliveredJournal, undelivered_spans

__all__ = [
    "LogExporter",
    "SpoolExporter",
    "StdoutExporter",
    "UndeliveredJournal",
    "ZeroCodeSpoolExporter",
    "build_sinks",
    "sinks_of",
    "endpoint_configured",
    "otlp_exporter",
    "read_spool",
    "spool_files",
    "spool_spans",
    "undelivered_spans",
]


_SINK_CLASSES = {"spool": SpoolExporter, "log": LogExporter, "stdout": StdoutExporter}


def sinks_of(exporters: list[SpanExporter]) -> set[str]:
    """The local sinks among ``exporters`` (a provider's, set up by the OTel configurator)."""
    return {name for name, cls in _SINK_CLASSES.items() for e in exporters if isinstance(e, cls)}


def build_sinks(
    output: tuple[str, ...], path: str, otlp: bool, spool_max_bytes: int | None = None
) -> dict[str, SpanExporter]:
    """Exporters by sink name, for validated ``output`` names (``none`` removed)."""
    sinks: dict[str, SpanExporter] = {}
    for name in output:
        if name == "spool":
            sinks[name] = SpoolExporter(path, spool_max_bytes)
        elif name == "log":
            sinks[name] = LogExporter()
        elif name == "stdout":
            sinks[name] = StdoutExporter()
    if otlp:
        sinks["otlp"] = otlp_exporter()
    return sinks
