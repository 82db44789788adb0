"""The ``cirron`` command (also ``python -m cirron``): a spool directory, on its own.

::

    cirron show [PATH] [--name N] [--last K] [--rank R] [--format text|json|df-csv]
    cirron export [PATH] --endpoint URL [--protocol http/protobuf|grpc] [--header K=V ...]
    cirron export [PATH] --format chrome -o trace.json
    cirron report [PATH] -o report.html
    cirron show [PATH] --diagnose

``show`` prints the runs of a spool directory (default ``./.cirron``) as
``ci.trace()`` does, through the same read-back (:mod:`cirron.offline.readback`):
one tree per process. ``export --format chrome`` writes Chrome Trace Event
JSON (Perfetto, ``chrome://tracing``). ``export`` replays the spool to an OTLP backend with
the official exporter, file by file in bounded batches; the files delivered
are noted under ``<PATH>/exported/``, so a re-run sends only what was not
delivered yet. A corrupt or unreadable file is named on stderr and skipped;
the others are still processed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..exporters import spool_files
from ..exporters.otlp_json import decode_request
from ..otel import semconv
from . import readback

_BATCH = 512  # spans per OTLP request when replaying


class SpoolError(Exception):
    """The spool directory itself can't be used (missing, empty)."""


def _files(path: str) -> list[str]:
    if not os.path.isdir(path):
        raise SpoolError(f"no spool at {path!r}: no such directory")
    files = spool_files(path)
    if not files:
        raise SpoolError(f"no spool files in {os.path.join(path, 'spool')!r}")
    return files


def _read(files: Sequence[str]) -> Iterator[tuple[str, list[Any]]]:
    """(file, its spans) for every file that reads; a bad one is named on stderr and skipped."""
    for name in files:
        try:
            with open(name, encoding="utf-8") as stream:
                spans = decode_request(json.load(stream))
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"cirron: skipping {name}: {type(error).__name__}: {error}", file=sys.stderr)
            continue
        yield name, spans


def _progress(done: int, total: int, what: str) -> None:
    """A progress line on a terminal; nothing when stderr is a file or a pipe."""
    if total > 20 and sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r{what}: {done}/{total} files", end=end, file=sys.stderr, flush=True)


# -- show ---------------------------------------------------------------------------------------
def _spans(path: str) -> list[Any]:
    files = _files(path)
    spans: list[Any] = []
    for position, (_name, read) in enumerate(_read(files), 1):
        spans += read
        _progress(position, len(files), "reading")
    return spans


def show(arguments: argparse.Namespace) -> int:
    spans = _spans(arguments.path)
    if arguments.diagnose:
        from .report import diagnose

        for finding in diagnose(spans):
            print(finding.text)
        return 0
    if arguments.rank is not None:
        spans = [s for s in spans if s.resource.attributes.get(semconv.RANK) == arguments.rank]
    fmt = {"text": "text", "json": "json", "df-csv": "df"}[arguments.format]
    result = readback.render_spans(spans, fmt, arguments.name, arguments.last)
    if fmt == "df":
        result.to_csv(sys.stdout, index=False)
    else:
        print(result)
    return 0


# -- export -------------------------------------------------------------------------------------
def _journal(path: str, endpoint: str) -> str:
    key = hashlib.sha256(endpoint.encode()).hexdigest()[:16]
    return os.path.join(path, "exported", f"{key}.txt")


def _delivered(journal: str) -> set[str]:
    try:
        with open(journal, encoding="utf-8") as stream:
            return {line.strip() for line in stream if line.strip()}
    except FileNotFoundError:
        return set()


def _exporter(endpoint: str, protocol: str, headers: dict[str, str]) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, headers=headers or None, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    url = (
        endpoint
        if endpoint.rstrip("/").endswith("/v1/traces")
        else endpoint.rstrip("/") + "/v1/traces"
    )
    return HttpExporter(endpoint=url, headers=headers or None)


def chrome_events(spans: list[Any]) -> list[dict[str, Any]]:
    """Chrome Trace Event JSON events: a track per process (rank), spans, marks, snapshots.

    Spans are complete events (``ph: X``) on their process's track; a point
    mark is a counter track of its own (``ph: C``) in that process; a
    snapshot is an instant event (``ph: i``) at its epoch's boundary.
    Times are microseconds since the epoch, as the format wants.
    """
    events: list[dict[str, Any]] = []
    processes: dict[int, str] = {}
    for span in spans:
        resource = span.resource.attributes
        pid = int(resource.get(semconv.PROCESS_PID, 0))
        rank = resource.get(semconv.RANK)
        processes[pid] = (
            f"rank {rank} (pid {pid})"
            if rank is not None
            else f"{resource.get(semconv.SERVICE_NAME, 'python')} (pid {pid})"
        )
        start = span.start_time / 1000
        end = span.end_time if span.end_time is not None else span.start_time
        attributes = {k: _plain(v) for k, v in (span.attributes or {}).items()}
        if span.name == semconv.SNAPSHOT:
            events.append(
                {"name": semconv.SNAPSHOT, "ph": "i", "s": "p", "ts": start, "pid": pid, "tid": 0,
                 "args": attributes}
            )  # fmt: skip
            continue
        events.append(
            {"name": span.name + (f"[{attributes[semconv.INDEX]}]" if semconv.INDEX in attributes else ""),
             "cat": span.name, "ph": "X", "ts": start, "dur": (end - span.start_time) / 1000,
             "pid": pid, "tid": 0, "args": attributes}
        )  # fmt: skip
        for event in span.events:
            value = (event.attributes or {}).get(semconv.MARK_VALUE)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                events.append(
                    {"name": event.name, "ph": "C", "ts": event.timestamp / 1000, "pid": pid,
                     "args": {event.name: value}}
                )  # fmt: skip
    for pid, name in processes.items():
        events.append(
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
        )
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "training"}}
        )
    events.sort(key=lambda e: (e.get("ts", 0), -e.get("dur", 0)))
    return events


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, float) and value != value:
        return "NaN"  # JSON has no NaN
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return str(value)
    return value


def report(arguments: argparse.Namespace) -> int:
    from .report import build

    spans = _spans(arguments.path)
    with open(arguments.output, "w", encoding="utf-8") as stream:
        stream.write(build(spans, f"cirron run report: {os.path.abspath(arguments.path)}"))
    print(f"cirron: report of {len(spans)} spans written to {arguments.output}", file=sys.stderr)
    return 0


def export_chrome(arguments: argparse.Namespace) -> int:
    spans = _spans(arguments.path)
    document = {"traceEvents": chrome_events(spans), "displayTimeUnit": "ms"}
    with open(arguments.output, "w", encoding="utf-8") as stream:
        json.dump(document, stream, allow_nan=False)
    print(
        f"cirron: {len(spans)} spans written to {arguments.output} "
        "(open it in https://ui.perfetto.dev or chrome://tracing)",
        file=sys.stderr,
    )
    return 0


def export(arguments: argparse.Namespace) -> int:
    if arguments.format == "chrome":
        if not arguments.output:
            raise argparse.ArgumentTypeError("--format chrome needs -o FILE")
        return export_chrome(arguments)
    if not arguments.endpoint:
        raise argparse.ArgumentTypeError("export needs --endpoint URL (or --format chrome -o FILE)")
    from opentelemetry.sdk.trace.export import SpanExportResult

    files = _files(arguments.path)
    headers = dict(_header(text) for text in arguments.header)
    journal = _journal(arguments.path, arguments.endpoint)
    done = _delivered(journal)
    todo = [name for name in files if os.path.basename(name) not in done]
    exporter = _exporter(arguments.endpoint, arguments.protocol, headers)
    os.makedirs(os.path.dirname(journal), exist_ok=True)
    sent = failed = 0
    try:
        with open(journal, "a", encoding="utf-8") as record:
            for position, (name, spans) in enumerate(_read(todo), 1):
                ok = True
                for start in range(0, len(spans), _BATCH):
                    batch = spans[start : start + _BATCH]
                    if exporter.export(batch) == SpanExportResult.SUCCESS:
                        sent += len(batch)
                    else:
                        failed += len(batch)
                        ok = False
                if ok:  # a file counts as delivered once all of it was
                    record.write(os.path.basename(name) + "\n")
                    record.flush()
                _progress(position, len(todo), "exporting")
    finally:
        exporter.shutdown()
    skipped = len(files) - len(todo)
    print(
        f"cirron: {sent} spans delivered to {arguments.endpoint}"
        + (f", {failed} not delivered (run again to retry them)" if failed else "")
        + (f"; {skipped} files delivered before were skipped" if skipped else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


def _header(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(f"--header must be KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


# -- the command --------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="cirron", description="Read and replay the spool of profiled runs."
    )
    commands = top.add_subparsers(dest="command", required=True)
    path_help = "the cirron directory (default ./.cirron, or $CIRRON_PATH)"
    default_path = os.environ.get("CIRRON_PATH") or ".cirron"

    shown = commands.add_parser("show", help="print the span tree of the run(s)")
    shown.add_argument("path", nargs="?", default=default_path, help=path_help)
    shown.add_argument("--name", help="only spans of this name (with their subtrees)")
    shown.add_argument("--last", type=int, help="only the N most recently ended spans")
    shown.add_argument("--rank", type=int, help="only the process(es) of this rank")
    shown.add_argument(
        "--format", choices=("text", "json", "df-csv"), default="text", help="default: text"
    )
    shown.add_argument(
        "--diagnose", action="store_true", help="print the findings of `cirron report` instead"
    )
    shown.set_defaults(run=show)

    reported = commands.add_parser("report", help="write an offline HTML report of the run(s)")
    reported.add_argument("path", nargs="?", default=default_path, help=path_help)
    reported.add_argument("-o", "--output", default="report.html", help="default: report.html")
    reported.set_defaults(run=report)

    exported = commands.add_parser("export", help="replay the spool to an OTLP backend (resumable)")
    exported.add_argument("path", nargs="?", default=default_path, help=path_help)
    exported.add_argument("--endpoint", help="OTLP endpoint, e.g. http://127.0.0.1:4318")
    exported.add_argument(
        "--format", choices=("otlp", "chrome"), default="otlp",
        help="otlp (replay to --endpoint, the default) or chrome (Chrome Trace Event JSON, -o)",
    )  # fmt: skip
    exported.add_argument("-o", "--output", help="the file --format chrome writes")
    exported.add_argument(
        "--protocol", choices=("http/protobuf", "grpc"), default="http/protobuf",
        help="default: http/protobuf",
    )  # fmt: skip
    exported.add_argument(
        "--header", action="append", default=[], metavar="KEY=VALUE",
        help="a header for every request (repeatable), e.g. x-mlflow-experiment-id=0",
    )  # fmt: skip
    exported.set_defaults(run=export)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if getattr(arguments, "last", None) is not None and arguments.last < 0:
        parser().error("--last must be 0 or more")
    try:
        for text in getattr(arguments, "header", []):
            _header(text)
        return int(arguments.run(arguments))
    except argparse.ArgumentTypeError as error:
        print(f"cirron: {error}", file=sys.stderr)
        return 2
    except SpoolError as error:
        print(f"cirron: {error}", file=sys.stderr)
        return 2
    except ImportError as error:  # an optional dependency (plotly for the report)
        print(f"cirron: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cirron show | head`
        return 0
