"""The ``cirron`` command (also ``python -m cirron``): a spool directory, on its own.

::

    cirron runs [PATH]
    cirron show [PATH] [--run N|ID|all] [--name N] [--last K] [--rank R] [--format text|json|df-csv]
    cirron show [PATH] --diagnose [--run N|ID|all]
    cirron export [PATH] --endpoint URL [--protocol http/protobuf|grpc] [--header K=V ...]
                  [--all] [--timeout SECONDS]
    cirron export [PATH] --format chrome -o trace.json
    cirron report [PATH] -o report.html
    cirron --version

PATH is the cirron directory (``./.cirron`` by default), its spool folder, or one spool file.
A folder can hold several runs (:mod:`cirron.offline.runs`); every command but ``runs`` reads
the latest unless ``--run`` picks another, and says so when there are more. ``show`` prints
them as ``ci.trace()`` does, through the same read-back (:mod:`cirron.offline.readback`): one
tree per process; ``--diagnose`` prints the findings (:mod:`cirron.offline.findings`).
``export --format chrome`` writes Chrome Trace Event JSON (:mod:`cirron.offline.chrome`).
``export --endpoint`` sends the spans the endpoint has not acknowledged yet
(:mod:`cirron.offline.replay`). A corrupt or unreadable file is named on stderr and skipped;
the others are still read. Errors in the arguments exit with 2 before any work, a filter that
matches nothing with 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..exporters import files, spool_reader
from ..exporters.ledger import Ledger
from ..exporters.lines import format_duration
from ..otel import semconv
from ..otel.version import __version__
from . import (
    chrome,
    compare,
    findings,
    outline,
    rank_findings,
    ranks,
    readback,
    reading,
    replay,
    run_index,
    runs,
    step_table,
)

RUN_HELP = (
    "which run: N (1 the oldest, -1 the latest, as `cirron runs` numbers them), "
    "a run id or its first characters, or all (default: the latest)"
)


class SpoolError(Exception):
    """The spool directory itself can't be used (missing, empty)."""


class NothingMatches(Exception):
    """A filter (``--rank``, ``--name``) left nothing to show."""


def _files(path: str) -> list[str]:
    """The spool files at ``path``: a cirron directory, its spool folder, or one file."""
    if not os.path.exists(path):
        raise SpoolError(f"no spool at {path!r}: no such file or directory")
    files = spool_reader.spool_files(path)
    if not files:
        raise SpoolError(f"no spool files in {spool_reader.spool_folder(path)!r}")
    return files


def _read(files: Sequence[str]) -> Iterator[tuple[str, list[Any]]]:
    """(file, its spans) for every file; what did not read is named on stderr, once per file
    (:mod:`cirron.exporters.spool_reader` keeps every span that reads)."""
    for read in spool_reader.read_files(files):
        if read.problem is not None:
            print(f"cirron: {read.problem}", file=sys.stderr)
        yield read.name, read.spans


# -- show ---------------------------------------------------------------------------------------
def _spans(path: str) -> list[Any]:
    files = _files(path)
    spans: list[Any] = []
    with replay.progress(len(files), " files", minimum=20) as bar:
        for _name, read in _read(files):
            spans += read
            bar.update(1)
    return spans


def _step_runs(path: str) -> list[runs.Run]:
    """The runs at ``path`` for a question about steps: their step rows from the index where
    it has them, and then not the spans of their parts (:mod:`cirron.offline.reading`)."""
    files = _files(path)
    with replay.progress(len(files), " files", minimum=20) as bar:
        return reading.read_runs(
            path, lambda problem: print(f"cirron: {problem}", file=sys.stderr), bar.update
        )


def _chosen_runs(arguments: argparse.Namespace, *, steps: bool = False) -> list[runs.Run]:
    """The runs ``--run`` picks (default: the latest), saying so when the folder holds more.
    ``steps``: for a question about steps (see :func:`_step_runs`)."""
    every = _step_runs(arguments.path) if steps else runs.runs_of(_spans(arguments.path))
    chosen = _pick(every, arguments)
    _say_which(every, chosen, arguments)
    return chosen


def _pick(every: list[runs.Listed], arguments: argparse.Namespace) -> list[runs.Listed]:
    """The runs of ``every`` that ``--run`` picks."""
    try:
        return runs.pick(every, arguments.run)
    except LookupError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _say_which(every: list[Any], chosen: list[Any], arguments: argparse.Namespace) -> None:
    """Say which run this is, when the folder holds more."""
    if len(every) > 1 and arguments.run != runs.ALL:
        numbers = ", ".join(str(every.index(run) + 1) for run in chosen)
        print(
            f"cirron: {len(every)} runs in {arguments.path}; this is run {numbers} "
            f"({'the latest' if arguments.run is None else 'as asked'}). "
            "`cirron runs` lists them; --run N|ID|all picks another.",
            file=sys.stderr,
        )


def _chosen(arguments: argparse.Namespace) -> list[Any]:
    return [span for run in _chosen_runs(arguments) for span in run.spans]


def show(arguments: argparse.Namespace) -> int:
    if arguments.diagnose:
        return diagnose(arguments)
    if arguments.ranks:
        return show_ranks(arguments)
    whole = arguments.all or arguments.format != "text"
    if not whole and arguments.name is None and arguments.last is None and arguments.rank is None:
        shown = _outline(arguments)
        if shown is not None:
            print(shown)
            return 0
    spans = _chosen(arguments)
    if arguments.rank is not None:
        ranks = sorted({s.resource.attributes.get(semconv.RANK) for s in spans} - {None})
        spans = [s for s in spans if s.resource.attributes.get(semconv.RANK) == arguments.rank]
        if not spans:
            here = ", ".join(map(str, ranks)) if ranks else "none: one process, no rank"
            raise NothingMatches(f"no spans match --rank {arguments.rank} (ranks here: {here})")
    if arguments.name is not None and not any(s.name == arguments.name for s in spans):
        names = sorted({str(s.name) for s in spans})
        shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        raise NothingMatches(f"no spans match --name {arguments.name} (names here: {shown})")
    fmt = {"text": "text", "json": "json", "df-csv": "df"}[arguments.format]
    result = readback.render_spans(spans, fmt, arguments.name, arguments.last)
    if fmt == "df":
        result.to_csv(sys.stdout, index=False)
    else:
        print(result)
    return 0


def _outline(arguments: argparse.Namespace) -> str | None:
    """The outline of the run(s) ``--run`` picks when they hold more steps than a tree shows
    (:mod:`cirron.offline.outline`); None to print every span (a short run, or one the
    index does not cover)."""
    path = arguments.path
    _files(path)
    every = run_index.listed_runs(path)
    chosen = _pick(every, arguments)
    steps = sum(run.steps for run in chosen)
    if steps <= outline.SHOWN_STEPS:
        return None
    keys = {runs.process_key_of(p.lines[0]["resource"]) for run in chosen for p in run.processes}
    tables = [t for t in step_table.step_tables(path, indexed_only=True) if t.key in keys]
    if len(tables) < len(keys):
        return None  # a process the index does not cover: every span
    _say_which(every, chosen, arguments)
    sessions = {
        session["id"]
        for run in chosen
        for line in run.lines
        for session in line["sessions"]
        if "id" in session
    }
    found = outline.outline(tables, sessions)
    folder = spool_reader.spool_folder(path) if not os.path.isfile(path) else ""
    names = [os.path.join(folder, line["file"]) for run in chosen for line in run.lines]
    spans = outline.read_outlined(
        sorted(set(names), key=spool_reader.spool_files_order),
        found,
        lambda problem: print(f"cirron: {problem}", file=sys.stderr),
    )
    return (
        f"(a run of {steps:,} steps, outlined: the first and last epochs and steps, and the "
        "failed, non-finite and slowest steps; --all prints every span)\n"
        + outline.render(spans, found)
    )


def diagnose(arguments: argparse.Namespace) -> int:
    every = _chosen_runs(arguments, steps=True)
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
    """One line a run, from the spool's index (the files it has no line for are read)."""
    _files(arguments.path)  # a missing or empty spool is an error
    every = run_index.listed_runs(
        arguments.path, lambda problem: print(f"cirron: {problem}", file=sys.stderr)
    )
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


# -- show --ranks -------------------------------------------------------------------------------
def show_ranks(arguments: argparse.Namespace) -> int:
    """A table per run: each rank's step time by part (median/p95), and the steps where it
    was the slowest; then the ranks' findings."""
    if arguments.format == "df-csv":
        raise argparse.ArgumentTypeError("--ranks prints --format text or json")
    chosen = _chosen_runs(arguments, steps=True)
    if not chosen:  # every file was skipped (each named above)
        raise NothingMatches(f"no spans read from {arguments.path}: no ranks to line up")
    aligned = [(run, ranks.align(run)) for run in chosen]
    if all(alignment is None for _run, alignment in aligned):
        run = chosen[-1]
        processes = ", ".join(process.label for process in run.processes)
        raise NothingMatches(
            f"run {run.id[:16]} has one process with steps ({processes}): --ranks lines up "
            "the ranks of a run of several (torchrun --nproc_per_node=N)"
        )
    if arguments.format == "json":
        print(json.dumps([_ranks_json(run, a) for run, a in aligned if a is not None], indent=2))
        return 0
    for number, (run, alignment) in enumerate(aligned):
        if number:
            print()
        print(run_heading(run))
        if alignment is None:
            print("one process with steps: no ranks to line up")
            continue
        print(ranks.table(alignment))
        for finding in rank_findings.rank_findings(run):
            print(f"{finding.severity:<8} {finding.text}")
    return 0


def _ranks_json(run: runs.Run, alignment: ranks.Alignment) -> dict[str, Any]:
    found = rank_findings.rank_findings(run)
    return {
        "run": run.id,
        **ranks.as_json(alignment),
        "findings": [{"severity": f.severity, "text": f.text, "figures": f.figures} for f in found],
    }


# -- compare ---------------------------------------------------------------------------------------
def _default_folder() -> str:
    return os.environ.get("CIRRON_PATH") or ".cirron"


def _run_named(text: str, folder: str, read: dict[str, list[runs.Run]]) -> tuple[runs.Run, str]:
    """The run ``text`` names, and where it is: a spool folder or file (its latest run), else
    a run of ``folder`` by number or id (as ``cirron runs`` lists them)."""
    source = text if os.path.exists(text) else folder
    if source not in read:
        read[source] = _step_runs(source)
    every = read[source]
    if not every:
        raise SpoolError(f"no runs in {source!r}")
    if source == text:
        if len(every) > 1:
            print(
                f"cirron: {len(every)} runs in {text}; comparing the latest (name one by "
                f"number or id, with --folder {text})",
                file=sys.stderr,
            )
        return every[-1], text
    try:
        chosen = [] if text == runs.ALL else runs.pick(every, text)
    except LookupError:
        chosen = []
    if len(chosen) != 1:
        known = ", ".join(f"{n} ({run.id[:12]})" for n, run in enumerate(every, 1))
        raise argparse.ArgumentTypeError(
            f"{text!r} is no spool folder, nor one run in {folder} (its runs: {known})"
        )
    return chosen[0], f"{folder}, run {every.index(chosen[0]) + 1}"


def _threshold(text: str | None) -> float | None:
    """``--threshold``: ``5%``, or a fraction such as ``0.05``."""
    if text is None:
        return None
    percent = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%")) / (100 if percent else 1)
    except ValueError:
        value = -1.0
    if value < 0 or (not percent and value >= 1):
        raise argparse.ArgumentTypeError(
            f"--threshold takes a percentage such as 5% (or a fraction such as 0.05), got {text!r}"
        )
    return value


def _summaries(
    arguments: argparse.Namespace, first: str, second: str
) -> tuple[compare.Summary, compare.Summary, tuple[str, str]]:
    """The figures of the two runs ``first`` and ``second`` name, and where each is."""
    read: dict[str, list[runs.Run]] = {}
    run_a, where_a = _run_named(first, arguments.folder, read)
    run_b, where_b = _run_named(second, arguments.folder, read)
    return compare.summarize("A", run_a), compare.summarize("B", run_b), (where_a, where_b)


def compare_runs(arguments: argparse.Namespace) -> int:
    threshold = _threshold(arguments.threshold)
    a, b, where = _summaries(arguments, arguments.a, arguments.b)
    said, over = compare.verdict(a, b, threshold)
    if arguments.format == "json":
        print(json.dumps(compare.as_json(a, b, where, threshold), indent=2))
    else:
        print(compare.text(a, b, where))
        print()
        print(said)
    return 1 if over else 0


# -- export ----------------------------------------------------------------------------------
def _check_output(path: str) -> None:
    """Fail before any work when ``-o`` can't be written."""
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"-o {path}: is a directory; name a file")
    if os.path.exists(path) and not os.path.isfile(path):  # a device or a pipe: written into
        if not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"-o {path}: not writable")
        return
    folder = os.path.dirname(os.path.realpath(path))  # (a symlink's file is replaced)
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"-o {path}: no such directory {folder}")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"-o {path}: the directory {folder} is not writable")


def report(arguments: argparse.Namespace) -> int:
    from .report import build

    _check_output(arguments.output)
    if arguments.other is not None:
        return report_two(arguments)
    chosen = _chosen_runs(arguments, steps=True)
    count = sum(run.span_count for run in chosen)
    page = build(chosen, f"cirron run report: {os.path.abspath(arguments.path)}")
    files.write_output(arguments.output, lambda stream: stream.write(page))
    print(f"cirron: report of {count:,} spans written to {arguments.output}", file=sys.stderr)
    return 0


def report_two(arguments: argparse.Namespace) -> int:
    """``cirron report A B``: the comparison first, then both runs' findings and charts."""
    from .report import build

    if arguments.run is not None:
        raise argparse.ArgumentTypeError("--run picks one run; with two runs, name each by itself")
    a, b, where = _summaries(arguments, arguments.path, arguments.other)
    page = build([a.run, b.run], f"cirron: {where[0]} against {where[1]}", (a, b, where))
    files.write_output(arguments.output, lambda stream: stream.write(page))
    print(f"cirron: report of two runs written to {arguments.output}", file=sys.stderr)
    return 0


def export_chrome(arguments: argparse.Namespace) -> int:
    """The trace of the run(s) ``--run`` picks, read a file at a time (the index says which
    files and processes they are) and written as it is laid out."""
    path = arguments.path
    _files(path)
    said: set[str] = set()  # the files whose problem is said (once, though read twice)

    def say(problem: spool_reader.Problem) -> None:
        if problem.file not in said:
            said.add(problem.file)
            print(f"cirron: {problem}", file=sys.stderr)

    every = run_index.listed_runs(path, say)  # (it reads the files the index does not cover)
    chosen = _pick(every, arguments)
    _say_which(every, chosen, arguments)
    lines = [line for run in chosen for line in run.lines]
    folder = spool_reader.spool_folder(path)
    names = (
        [path]
        if os.path.isfile(path)
        else sorted(
            {os.path.join(folder, line["file"]) for line in lines},
            key=spool_reader.spool_files_order,
        )
    )
    first: dict[tuple[Any, ...], tuple[Any, int]] = {}
    for line in lines:
        key = chrome.process_key(line["resource"])
        start = min(line["start"], first[key][1]) if key in first else line["start"]
        first[key] = (line["resource"], start)
    origin = min((line["start"] for line in lines), default=0)
    count = chrome.write_spool(
        names,
        first.values(),
        origin,
        arguments.output,
        say,
    )
    print(
        f"cirron: {count} spans written to {arguments.output} "
        "(open it in https://ui.perfetto.dev or chrome://tracing)",
        file=sys.stderr,
    )
    return 0


def export(arguments: argparse.Namespace) -> int:
    if arguments.format == "chrome":
        if not arguments.output:
            raise argparse.ArgumentTypeError("--format chrome needs -o FILE")
        _check_output(arguments.output)
        return export_chrome(arguments)
    if not arguments.endpoint:
        raise argparse.ArgumentTypeError("export needs --endpoint URL (or --format chrome -o FILE)")
    try:
        endpoint = replay.check_endpoint(arguments.endpoint, arguments.protocol)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not 0 < arguments.timeout <= replay.MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"--timeout must be seconds, more than 0 and at most {replay.MAX_TIMEOUT:.0f}, "
            f"got {arguments.timeout}"
        )
    headers = dict(_header(text) for text in arguments.header)
    ledger = Ledger(spool_reader.cirron_directory(arguments.path), endpoint)
    try:
        ledger.prepare()
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"cannot note what {endpoint} acknowledges in {ledger.directory} "
            f"({error.strerror or error}): nothing sent, since every later export would send "
            "it all again. Make that folder writable, or copy the cirron folder somewhere "
            "writable and export from there"
        ) from None
    spans = _chosen(arguments)
    send = replay.sender(endpoint, arguments.protocol, headers, arguments.timeout)
    outcome = replay.replay(spans, ledger, send, arguments.all)
    print(f"cirron: {_summary(outcome, endpoint)}", file=sys.stderr)
    return 1 if outcome.unsent or outcome.rejected else 0


def _summary(outcome: replay.Outcome, endpoint: str) -> str:
    """One line: what was sent, what the endpoint had already, what is left and why."""
    text = f"{outcome.sent} spans sent to {endpoint}"
    if outcome.already:
        text += f", {outcome.already} it had already"
    if outcome.rejected:
        text += f"; {outcome.rejected} rejected ({outcome.rejected_why})"
    if outcome.unsent:
        text += (
            f"; {outcome.unsent} not sent: {outcome.stopped}. Run the same command again "
            f"{outcome.retry}: it sends only what is missing"
        )
    return text


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
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers(dest="command", required=True)
    _show_parser(commands)
    listed = commands.add_parser("runs", help="list the runs in the folder, oldest first")
    _path_argument(listed)
    listed.set_defaults(command_function=list_runs)
    _report_parser(commands)
    _compare_parser(commands)
    _export_parser(commands)
    return top


FOLDER_HELP = "where a run named by number or id is looked up (default ./.cirron, or $CIRRON_PATH)"
COMPARED_HELP = (
    "a spool folder or file (its latest run), or a run of --folder by number or id "
    "(as `cirron runs` lists them)"
)


def _report_parser(commands: Any) -> None:
    reported = commands.add_parser("report", help="write an offline HTML report of the run(s)")
    _path_argument(reported)
    reported.add_argument(
        "other",
        nargs="?",
        help="a second run: the report compares the two (each run as `cirron compare` takes it)",
    )
    reported.add_argument("-o", "--output", default="report.html", help="default: report.html")
    reported.add_argument("--run", help=RUN_HELP)
    reported.add_argument("--folder", default=_default_folder(), help=FOLDER_HELP)
    reported.set_defaults(command_function=report)


def _compare_parser(commands: Any) -> None:
    compared = commands.add_parser(
        "compare",
        help="two runs side by side: step time by part, throughput, input wait, memory, loss",
    )
    compared.add_argument("a", metavar="A", help="the run compared against: " + COMPARED_HELP)
    compared.add_argument("b", metavar="B", help="the run compared: " + COMPARED_HELP)
    compared.add_argument("--folder", default=_default_folder(), help=FOLDER_HELP)
    compared.add_argument(
        "--threshold",
        help="exit with 1 when B's median step is slower than A's by more than this, "
        "e.g. 5%% (for CI)",
    )
    compared.add_argument(
        "--format", choices=("text", "json"), default="text", help="default: text"
    )
    compared.set_defaults(command_function=compare_runs)


def _path_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "path",
        nargs="?",
        default=os.environ.get("CIRRON_PATH") or ".cirron",
        help="the cirron directory (default ./.cirron, or $CIRRON_PATH), its spool folder, "
        "or one spool file",
    )


def _show_parser(commands: Any) -> None:
    shown = commands.add_parser("show", help="print the span tree of the run(s)")
    _path_argument(shown)
    shown.add_argument("--name", help="only spans of this name (with their subtrees)")
    shown.add_argument("--last", type=int, help="only the N most recently ended spans")
    shown.add_argument("--rank", type=int, help="only the process(es) of this rank")
    shown.add_argument(
        "--format", choices=("text", "json", "df-csv"), default="text", help="default: text"
    )
    shown.add_argument(
        "--diagnose", action="store_true", help="print the findings of `cirron report` instead"
    )
    shown.add_argument(
        "--ranks",
        action="store_true",
        help="a table of the run's ranks, their steps lined up: each rank's step time by part "
        "(median and p95) and the steps where it was the slowest (text or json)",
    )
    shown.add_argument(
        "--all",
        action="store_true",
        help=f"every span, also of a run of more than {outline.SHOWN_STEPS} steps (which prints "
        "as an outline: its first and last epochs and steps, and the failed, non-finite and "
        "slowest ones)",
    )
    shown.add_argument("--run", help=RUN_HELP)
    shown.set_defaults(command_function=show)


def _export_parser(commands: Any) -> None:
    exported = commands.add_parser(
        "export",
        help="send the spool to an OTLP backend (only what it lacks), or write Chrome JSON",
    )
    _path_argument(exported)
    exported.add_argument("--endpoint", help="OTLP endpoint, e.g. http://127.0.0.1:4318")
    exported.add_argument(
        "--format", choices=("otlp", "chrome"), default="otlp",
        help="otlp (send to --endpoint, the default) or chrome (Chrome Trace Event JSON, -o)",
    )  # fmt: skip
    exported.add_argument("-o", "--output", help="the file --format chrome writes")
    exported.add_argument(
        "--protocol", choices=replay.PROTOCOLS, default="http/protobuf",
        help="default: http/protobuf",
    )  # fmt: skip
    exported.add_argument(
        "--header", action="append", default=[], metavar="KEY=VALUE",
        help="a header for every request (repeatable), e.g. x-mlflow-experiment-id=0",
    )  # fmt: skip
    exported.add_argument(
        "--all", action="store_true",
        help="send every span, also those the endpoint acknowledged before",
    )  # fmt: skip
    exported.add_argument(
        "--timeout", type=float, default=replay.DEFAULT_TIMEOUT, metavar="SECONDS",
        help="how long one request may take; a dead endpoint ends the export after it "
        f"(default {replay.DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    exported.add_argument("--run", help=RUN_HELP)
    exported.set_defaults(command_function=export)


# A command builds objects for every span it reads (a million and more for a long run), few in
# cycles: Python's cycle collector, at its default of a young collection every 700 objects, took
# a fifth of `cirron show`'s time. While a command runs it collects every 100,000.
_YOUNG_COLLECTION_EVERY = 100_000


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if getattr(arguments, "last", None) is not None and arguments.last < 0:
        parser().error("--last must be 0 or more")
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], _YOUNG_COLLECTION_EVERY), *thresholds[1:])
    try:
        return _command(arguments)
    finally:
        gc.set_threshold(*thresholds)


def _command(arguments: argparse.Namespace) -> int:
    try:
        for text in getattr(arguments, "header", []):
            _header(text)
        return int(arguments.command_function(arguments))
    except (argparse.ArgumentTypeError, SpoolError, compare.NothingToCompare) as error:
        print(f"cirron: {error}", file=sys.stderr)
        return 2
    except NothingMatches as error:
        print(f"cirron: {error}", file=sys.stderr)
        return 1
    except ImportError as error:  # an optional dependency (plotly for the report)
        print(f"cirron: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cirron show | head`
        return 0
    except OSError as error:  # an output path that can't be written
        print(f"cirron: cannot write: {error}", file=sys.stderr)
        return 1
