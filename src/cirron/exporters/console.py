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


class StdoutExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(PREFIX + span_line(span) + "\n" for span in spans)
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
            for span in spans:
                trace_logger.info("%s%s", PREFIX, span_line(span))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None
