"""Under ``opentelemetry-instrument``, one line when the OTLP exporters cannot export.

The configurator's exporters (traces, metrics, logs) log every failed export and every retry
at WARNING/ERROR: a run with no collector listening prints a dozen ``StatusCode.UNAVAILABLE``
lines after its own output. cirron, which runs the show there, keeps the first of them,
rewritten as one line that says what happened and what to do, and drops the rest (counted in
``suppressed``). A program's own exporters under ``ci.profile()`` are left alone: there the
sinks' :class:`cirron.exporters.otlp.RepeatFilter` applies on cirron's threads only.
"""

from __future__ import annotations

import logging

from .otlp import filter_loggers

# The official exporters' loggers (gRPC, HTTP and their shared code).
EXPORTER_LOGGERS = "opentelemetry.exporter"


class OneLine(logging.Filter):
    """The first record of the exporters' loggers becomes cirron's line; the others go."""

    def __init__(self) -> None:
        super().__init__()
        self.told = False
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(EXPORTER_LOGGERS) or record.levelno < logging.WARNING:
            return True
        if self.told:
            self.suppressed += 1
            return False
        self.told = True
        said = record.getMessage().splitlines()[0]
        said = said.split(", retrying")[0].split(". Error details")[0]  # (the retry log's)
        record.msg = (
            "cirron: OTLP export failed (%s); further export errors are not printed. The "
            "spool, when on, keeps the spans: `cirron export` sends them later. To keep "
            "everything local: OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none, and "
            "OTEL_TRACES_EXPORTER=none or a cirron_ sink"
        )
        record.args = (said[:160],)
        record.exc_info = record.exc_text = None
        return True


one_line = OneLine()


def install() -> None:
    """Put :data:`one_line` on each of the exporters' loggers (the configurator imported the
    exporters, so their loggers exist)."""
    filter_loggers(EXPORTER_LOGGERS, one_line)
