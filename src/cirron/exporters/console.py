"""The ``stdout`` and ``log`` sinks: one line per ended span.

``[cirron] epoch[0] - 142us {epoch_loss=0.5234}``; ``log`` writes the same
text at INFO on the ``cirron.trace`` logger.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .lines import span_line

PREFIX = "[cirron] "
trace_logger = logging.getLogger("cirron.trace")


def in_start_order(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    """A flush's spans in the order they began (they come in the order their sinks' batches
    were finished: steps and epochs before most of the forwards they hold)."""
    return sorted(spans, key=lambda span: span.start_time or 0)


class StdoutExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(PREFIX + span_line(span) + "\n" for span in in_start_order(spans))
        stream = sys.stdout
        if stream is not None:
            stream.write(text)
            stream.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class LogExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if trace_logger.isEnabledFor(logging.INFO):
            for span in in_start_order(spans):
                trace_logger.info("%s%s", PREFIX, span_line(span))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None
