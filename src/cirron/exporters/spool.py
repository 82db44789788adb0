"""The ``spool`` sink: each flush becomes one OTLP/JSON file, gzip-compressed by default.

Files are ``<path>/spool/<pid>-<sequence>.json.gz`` (``.json`` with
``spool_compression="none"``), each an ``ExportTraceServiceRequest`` in the standard OTLP
JSON encoding, a span a line, so any OTLP tool can read or replay them (``zcat`` first).
A file is written under a temporary name and renamed into place, so a reader never sees
half a file (see ``cirron.exporters.files``).

Why gzip: the standard library has it (no dependency, every platform), ``zcat``, ``jq``'s
users and the Collector's file receiver read it, and it makes a training run's spans about 8
times smaller (about 190 bytes a step of a plain torch loop, 1,560 plain). ISA-L writes it
where the ``speedups`` extra is installed, at a tenth of zlib's CPU, else zlib at level 5
(:mod:`cirron.exporters.deflate`); both release the GIL while they compress, so the work
overlaps the training thread's. zstd compresses as well but needs a package, and a reader
its tool.

With ``spool_max_bytes`` set, a process writes at most that many bytes of spool files (as
written: compressed): of the batch that would cross it, the spans that fit are written (as
a file of their own) and the rest is lost, and counted; nothing after it is written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .. import config
from . import deflate, files
from .otlp_json import encode_request
from .sinks import PartialExport
from .spool_index import IndexWriter

_log = logging.getLogger("cirron")


class SpoolFull(PartialExport):
    """The spool reached its size cap (``spool_max_bytes``): the first ``exported`` spans of
    this batch were written, nothing after them is."""


class SpoolExporter(SpanExporter):
    """Writes each batch as one OTLP/JSON file; stops for good at ``max_bytes``, if given."""

    def __init__(self, path: str, max_bytes: int | None = None, compression: str = "gzip") -> None:
        self.directory = os.path.join(path, "spool")
        self.max_bytes = max_bytes
        self.compression = config.resolve_spool_compression(compression)
        self._suffix = ".json.gz" if self.compression == "gzip" else ".json"
        self.bytes_written = 0
        self.files_written = 0
        self.full = False  # the cap was reached: nothing more is written
        self._sequence = 0
        self.index_writer = IndexWriter(path)  # a line per file: listing runs reads no span

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        written = 0
        if not self.full:
            data = self._encode(spans)
            kept = spans
            if self.max_bytes is not None and self.bytes_written + len(data) > self.max_bytes:
                self.full = True
                written, data = self._what_fits(spans)
                kept = spans[:written]
            if data:
                self.index_writer.append(self._write(data), kept)
        if self.full:  # the sink's worker counts the rest as dropped, and warns once
            raise SpoolFull(
                written,
                f"the spool reached its cap of {self.max_bytes} bytes (spool_max_bytes); "
                "later spans are not written to it",
            )
        return SpanExportResult.SUCCESS

    def _what_fits(self, spans: Sequence[ReadableSpan]) -> tuple[int, bytes]:
        """The longest first part of ``spans`` whose file fits under the cap, encoded.

        A binary search over encodings: a few encodes of part of one batch, once per run.
        """
        room = (self.max_bytes or 0) - self.bytes_written
        fits, data, low, high = 0, b"", 1, len(spans) - 1
        while low <= high:
            middle = (low + high) // 2
            encoded = self._encode(spans[:middle])
            if len(encoded) <= room:
                fits, data, low = middle, encoded, middle + 1
            else:
                high = middle - 1
        return fits, data

    def _encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        data = encode_request(spans).encode("ascii")
        if self.compression == "gzip":
            return deflate.gzip_member(data)
        return data

    def _write(self, data: bytes) -> str:
        files.make_directory(self.directory)
        pid = os.getpid()
        while True:  # never replace a file: an earlier profiler of this process, or an
            self._sequence += 1  # earlier run that had the same pid, may have written it
            final = os.path.join(self.directory, f"{pid}-{self._sequence:06d}{self._suffix}")
            if not os.path.exists(final):
                break
        files.write_whole(final, data)
        self.bytes_written += len(data)
        self.files_written += 1
        return final

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def spool_files(path: str = ".cirron") -> list[str]:
    """The spool files at ``path`` (a cirron directory, its spool folder or one file), oldest
    first per process: files named ``<pid>-<sequence>.json`` or ``.json.gz``, whatever else
    the folder holds."""
    from . import spool_reader  # the reader loads when asked, not with the writer

    return spool_reader.spool_files(path)


def iter_spool(path: str = ".cirron") -> Iterator[dict[str, Any]]:
    """Each spool file at ``path`` as an OTLP/JSON request dict, one file at a time: what
    :func:`read_spool` returns, in memory for one file only (a long run's spool).

    ``path`` is checked when this is called; the files are read as the caller asks for them.
    """
    path = config.path_argument("path", path)
    return _requests(spool_files(path))


def _requests(names: list[str]) -> Iterator[dict[str, Any]]:
    """The request of each file, holding just the spans that read, its text as written; a
    warning per file with a problem (see :mod:`cirron.exporters.spool_reader`)."""
    from . import spool_reader

    for read in spool_reader.read_files(names, repair=False):
        if read.problem is not None:
            _log.warning("cirron: %s", read.problem)
        if read.problem is None or not read.problem.whole:
            yield read.request


def iter_spool_spans(path: str = ".cirron") -> Iterator[dict[str, Any]]:
    """Each span of the spool as an OTLP/JSON dict with its ``resource`` attributes, a file
    at a time: what :func:`spool_spans` returns, without holding them all."""
    return _spans(iter_spool(path))


def _spans(requests: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for request in requests:
        for resource_spans in request["resourceSpans"]:
            resource = resource_spans["resource"]["attributes"]
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    yield dict(span, resource=resource)


def read_spool(path: str = ".cirron") -> list[dict[str, Any]]:
    """Every spool file at ``path`` as an OTLP/JSON request dict.

    ``path`` is a cirron directory, its spool folder or one file. A file that does not
    read is left out, a span that does not is left out of its request, and each such file
    is named in one warning on the ``cirron`` logger, with the reason. Text is as written,
    a lone surrogate included (the ``cirron`` command shows it as U+FFFD). For a long run,
    :func:`iter_spool` gives the same a file at a time.
    """
    return list(iter_spool(path))


def spool_spans(path: str = ".cirron") -> list[dict[str, Any]]:
    """All spans of the spool as OTLP/JSON dicts, each with its ``resource`` attributes.

    Read as :func:`read_spool` reads: every span that reads, and one warning per file that
    did not read whole. For a long run, :func:`iter_spool_spans` gives them a file at a time.
    """
    from . import spool_reader

    with spool_reader.collector_paused():  # a dict a span, none in a cycle
        return list(iter_spool_spans(path))


class ZeroCodeSpoolExporter(SpoolExporter):
    """``OTEL_TRACES_EXPORTER=cirron_spool``: the spool, configured from ``CIRRON_*`` variables.

    The OpenTelemetry configurator builds exporters with no arguments: the
    directory is ``$CIRRON_PATH`` (``./.cirron`` by default), the cap
    ``$CIRRON_SPOOL_MAX_BYTES`` and the compression ``$CIRRON_SPOOL_COMPRESSION``, read as
    ``ci.profile()`` reads them.
    """

    def __init__(self) -> None:
        settings = config.resolve(None, True)  # the settings know the defaults
        super().__init__(settings.path, settings.spool_max_bytes, settings.spool_compression)
