"""The ``spool`` sink: each flush becomes one OTLP/JSON file.

Files are ``<path>/spool/<pid>-<sequence>.json``, each an
``ExportTraceServiceRequest`` in the standard OTLP JSON encoding, so any OTLP
tool can read or replay them. A file is written under a temporary name and
renamed into place, so a reader never sees half a file (see ``cirron.exporters.files``).
With ``spool_max_bytes`` set, a process writes at most that many bytes of
spool files: the batch that would cross it is the first one not written.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .. import config
from . import files
from .otlp_json import encode_request


class SpoolFull(Exception):
    """The spool reached its size cap (``spool_max_bytes``); later batches are not written."""


class SpoolExporter(SpanExporter):
    """Writes each batch as one OTLP/JSON file; stops for good at ``max_bytes``, if given."""

    def __init__(self, path: str, max_bytes: int | None = None) -> None:
        self.directory = os.path.join(path, "spool")
        self.max_bytes = max_bytes
        self.bytes_written = 0
        self.files_written = 0
        self.full = False  # the cap was reached: nothing more is written
        self._sequence = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        if not self.full:
            data = encode_request(spans).encode("ascii")
            self.full = self.max_bytes is not None and (
                self.bytes_written + len(data) > self.max_bytes
            )
        if self.full:  # the sink's worker counts the batch as dropped, and warns once
            raise SpoolFull(
                f"the spool reached its cap of {self.max_bytes} bytes (spool_max_bytes); "
                "later spans are not written to it"
            )
        self._write(data)
        return SpanExportResult.SUCCESS

    def _write(self, data: bytes) -> None:
        files.make_directory(self.directory)
        pid = os.getpid()
        while True:  # never replace a file: an earlier profiler of this process, or an
            self._sequence += 1  # earlier run that had the same pid, may have written it
            final = os.path.join(self.directory, f"{pid}-{self._sequence:06d}.json")
            if not os.path.exists(final):
                break
        files.write_whole(final, data)
        self.bytes_written += len(data)
        self.files_written += 1

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def spool_files(path: str = ".cirron") -> list[str]:
    """The spool files under ``path``, oldest first per process."""

    def order(name: str) -> tuple[int, int]:
        pid, _, sequence = os.path.basename(name)[: -len(".json")].partition("-")
        return int(pid), int(sequence)

    names = glob.glob(os.path.join(path, "spool", "*-*.json"))
    return sorted(names, key=order)


def read_spool(path: str = ".cirron") -> list[dict[str, Any]]:
    """Every spool file under ``path`` as an OTLP/JSON request dict."""
    requests = []
    for name in spool_files(path):
        with open(name, encoding="utf-8") as stream:
            requests.append(json.load(stream))
    return requests


def spool_spans(path: str = ".cirron") -> list[dict[str, Any]]:
    """All spans of the spool as OTLP/JSON dicts, each with its ``resource`` attributes."""
    spans = []
    for request in read_spool(path):
        for resource_spans in request.get("resourceSpans", []):
            resource = resource_spans.get("resource", {}).get("attributes", [])
            for scope_spans in resource_spans.get("scopeSpans", []):
                for span in scope_spans.get("spans", []):
                    spans.append(dict(span, resource=resource))
    return spans


class ZeroCodeSpoolExporter(SpoolExporter):
    """``OTEL_TRACES_EXPORTER=cirron_spool``: the spool, configured from ``CIRRON_*`` variables.

    The OpenTelemetry configurator builds exporters with no arguments: the
    directory is ``$CIRRON_PATH`` (``./.cirron`` by default) and the cap
    ``$CIRRON_SPOOL_MAX_BYTES``, read as ``ci.profile()`` reads them.
    """

    def __init__(self) -> None:
        settings = config.resolve(None, True)  # the settings know the defaults
        super().__init__(settings.path, settings.spool_max_bytes)
