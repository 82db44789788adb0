"""The ``cirron`` command (also ``python -m cirron``): a spool directory, on its own.

::

    cirron runs [PATH]
    cirron show [PATH] [--run N|ID|all] [--name N] [--last K] [--rank R] [--format text|json|df-csv]
    cirron show [PATH] --diagnose [--run N|ID|all]
    cirron export [PATH] --endpoint URL [--protocol http/protobuf|grpc] [--header K=V ...]
    cirron export [PATH] --format chrome -o trace.json
    cirron report [PATH] -o report.html

A folder can hold several runs (:mod:`cirron.offline.runs`); every command but ``runs`` reads
the latest unless ``--run`` picks another, and says so when there are more. ``show`` prints
them as ``ci.trace()`` does, through the same read-back (:mod:`cirron.offline.readback`): one
tree per process; ``--diagnose`` prints the findings (:mod:`cirron.offline.findings`).
``export --format chrome`` writes Chrome Trace Event JSON (:mod:`cirron.offline.chrome`).
``export`` replays the spool to an OTLP backend with the official exporter, file by file in
bounded batches; the files delivered are noted under ``<PATH>/exported/``, so a re-run sends
only what was not delivered yet. A corrupt or unreadable file is named on stderr and skipped;
the others are still processed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..exporters import spool_files
from ..exporters.lines import format_duration
from ..exporters.otlp_json import decode_request
from ..otel import semconv
from . import chrome, findings, readback, runs

_BATCH = 512  # spans per OTLP request when replaying
RUN_HELP = (
    "which run: N (1 the oldest, -1 the latest, as `cirron runs` numbers them), "
    "a run id or its first characters, or all (default: the latest)"
)


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


def _chosen_runs(arguments: argparse.Namespace) -> list[runs.Run]:
    """The runs ``--run`` picks (default: the latest), saying so when the folder holds more."""
    every = runs.runs_of(_spans(arguments.path))
    try:
        chosen = runs.pick(every, arguments.run)
    except LookupError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if len(every) > 1 and arguments.run != runs.ALL:
        numbers = ", ".join(str(every.index(run) + 1) for run in chosen)
        print(
            f"cirron: {len(every)} runs in {arguments.path}; this is run {numbers} "
            f"({'the latest' if arguments.run is None else 'as asked'}). "
            "`cirron runs` lists them; --run N|ID|all picks another.",
            file=sys.stderr,
        )
    return chosen


def _chosen(arguments: argparse.Namespace) -> list[Any]:
    return [span for run in _chosen_runs(arguments) for span in run.spans]


def show(arguments: argparse.Namespace) -> int:
    if arguments.diagnose:
        return diagnose(arguments)
    spans = _chosen(arguments)
    if arguments.rank is not None:
        spans = [s for s in spans if s.resource.attributes.get(semconv.RANK) == arguments.rank]
    fmt = {"text": "text", "json": "json", "df-csv": "df"}[arguments.format]
    result = readback.render_spans(spans, fmt, arguments.name, arguments.last)
    if fmt == "df":
        result.to_csv(sys.stdout, index=False)
    else:
        print(result)
    return 0


def diagnose(arguments: argparse.Namespace) -> int:
    every = _chosen_runs(arguments)
    for number, run in enumerate(every):
        if number:
            print()
        print(run_heading(run))
        for finding in findings.diagnose(run):
            print(f"{finding.severity:<8} {finding.text}")
            if finding.action:
                print(f"{'':<8} next: {finding.action}")
    return 0


def run_heading(run: runs.Run) -> str:
    """One line about a run: its id, framework, processes, steps and how it ended."""
    processes = ", ".join(process.label for process in run.processes)
    return (
        f"run {run.id[:16]} · {', '.join(run.frameworks) or 'no framework'} · {processes} · "
        f"{run.steps} steps · {format_duration(run.end_ns - run.start_ns)} · "
        f"{'failed' if run.failed else 'ok'}"
    )


HEADING = (
    "  #  run               start                 duration  framework       processes"
    "          steps  status"
)


def list_runs(arguments: argparse.Namespace) -> int:
    every = runs.runs_of(_spans(arguments.path))
    print(HEADING)
    for number, run in enumerate(every, 1):
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.start_ns / 1e9))
        processes = ", ".join(process.label for process in run.processes)
        print(
            f"{number:>3}  {run.id[:16]:<16}  {start:<19}  "
            f"{format_duration(run.end_ns - run.start_ns):>9}  "
            f"{', '.join(run.frameworks) or '-':<14}  {processes:<16}  {run.steps:>6}  "
            f"{'failed' if run.failed else 'ok'}"
        )
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


def report(arguments: argparse.Namespace) -> int:
    from .report import build

    chosen = _chosen_runs(arguments)
    spans = [span for run in chosen for span in run.spans]
    with open(arguments.output, "w", encoding="utf-8") as stream:
        stream.write(build(chosen, f"cirron run report: {os.path.abspath(arguments.path)}"))
    print(f"cirron: report of {len(spans)} spans written to {arguments.output}", file=sys.stderr)
    return 0


def export_chrome(arguments: argparse.Namespace) -> int:
    spans = _chosen(arguments)
    chrome.write(spans, arguments.output)
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
    processes = {
        runs.process_key(process.spans[0].resource)
        for run in _chosen_runs(arguments)
        for process in run.processes
    }
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
                if not any(runs.process_key(span.resource) in processes for span in spans):
                    continue  # another run's file (a spool file is one process's)
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
    shown.add_argument("--run", help=RUN_HELP)
    shown.set_defaults(command_function=show)

    listed = commands.add_parser("runs", help="list the runs in the folder, oldest first")
    listed.add_argument("path", nargs="?", default=default_path, help=path_help)
    listed.set_defaults(command_function=list_runs)

    reported = commands.add_parser("report", help="write an offline HTML report of the run(s)")
    reported.add_argument("path", nargs="?", default=default_path, help=path_help)
    reported.add_argument("-o", "--output", default="report.html", help="default: report.html")
    reported.add_argument("--run", help=RUN_HELP)
    reported.set_defaults(command_function=report)

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
    exported.add_argument("--run", help=RUN_HELP)
    exported.set_defaults(command_function=export)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if getattr(arguments, "last", None) is not None and arguments.last < 0:
        parser().error("--last must be 0 or more")
    try:
        for text in getattr(arguments, "header", []):
            _header(text)
        return int(arguments.command_function(arguments))
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
    except OSError as error:  # an output path that can't be written
        print(f"cirron: cannot write: {error}", file=sys.stderr)
        return 1
