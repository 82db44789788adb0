"""``cirron export``: send a run to an OTLP backend (only what it has not acknowledged), or
write it as Chrome Trace Event JSON."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...exporters import spool_reader
from ...exporters.ledger import Ledger
from .. import chrome, replay, run_index
from .common import (
    RUN_HELP,
    check_output,
    chosen_spans,
    path_argument,
    pick,
    say_problem,
    say_which,
    spool_files,
)


def export_chrome(arguments: argparse.Namespace) -> int:
    """The trace of the run(s) ``--run`` picks, read a file at a time (the index says which
    files and processes they are) and written as it is laid out."""
    path = arguments.path
    spool_files(path)  # a missing or empty spool is an error
    said: set[str] = set()  # the files whose problem is said (once, though read twice)

    def say(problem: spool_reader.Problem) -> None:
        if problem.file not in said:
            said.add(problem.file)
            say_problem(problem)

    every = run_index.listed_runs(path, say)  # (it reads the files the index does not cover)
    chosen = pick(every, arguments)
    say_which(every, chosen, arguments)
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
    count = chrome.write_spool(names, first.values(), origin, arguments.output, say)
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
        check_output(arguments.output)
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
    headers = dict(header(text) for text in arguments.header)
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
    spans = chosen_spans(arguments)
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


def header(text: str) -> tuple[str, str]:
    """``--header KEY=VALUE``."""
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(f"--header must be KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_parser(commands: Any) -> None:
    exported = commands.add_parser(
        "export",
        help="send the spool to an OTLP backend (only what it lacks), or write Chrome JSON",
    )
    path_argument(exported)
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
