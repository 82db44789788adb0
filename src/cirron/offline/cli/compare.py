"""``cirron compare A B``: two runs side by side, and with ``--threshold`` a verdict for CI."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import compare, runs
from .common import SpoolError, default_folder, step_runs

FOLDER_HELP = "where a run named by number or id is looked up (default ./.cirron, or $CIRRON_PATH)"
COMPARED_HELP = (
    "a spool folder or file (its latest run), or a run of --folder by number or id "
    "(as `cirron runs` lists them)"
)


def _run_named(text: str, folder: str, read: dict[str, list[runs.Run]]) -> tuple[runs.Run, str]:
    """The run ``text`` names, and where it is: a spool folder or file (its latest run), else
    a run of ``folder`` by number or id (as ``cirron runs`` lists them)."""
    source = text if os.path.exists(text) else folder
    if source not in read:
        read[source] = step_runs(source)
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


def summaries(
    arguments: argparse.Namespace, first: str, second: str
) -> tuple[compare.Summary, compare.Summary, tuple[str, str]]:
    """The figures of the two runs ``first`` and ``second`` name, and where each is."""
    read: dict[str, list[runs.Run]] = {}
    run_a, where_a = _run_named(first, arguments.folder, read)
    run_b, where_b = _run_named(second, arguments.folder, read)
    return compare.summarize("A", run_a), compare.summarize("B", run_b), (where_a, where_b)


def compare_runs(arguments: argparse.Namespace) -> int:
    threshold = _threshold(arguments.threshold)
    a, b, where = summaries(arguments, arguments.a, arguments.b)
    said, over = compare.verdict(a, b, threshold)
    if arguments.format == "json":
        print(json.dumps(compare.as_json(a, b, where, threshold), indent=2))
    else:
        print(compare.text(a, b, where))
        print()
        print(said)
    return 1 if over else 0


def add_parser(commands: Any) -> None:
    compared = commands.add_parser(
        "compare",
        help="two runs side by side: step time by part, throughput, input wait, memory, loss",
    )
    compared.add_argument("a", metavar="A", help="the run compared against: " + COMPARED_HELP)
    compared.add_argument("b", metavar="B", help="the run compared: " + COMPARED_HELP)
    compared.add_argument("--folder", default=default_folder(), help=FOLDER_HELP)
    compared.add_argument(
        "--threshold",
        help="exit with 1 when B's median step is slower than A's by more than this, "
        "e.g. 5%% (for CI)",
    )
    compared.add_argument(
        "--format", choices=("text", "json"), default="text", help="default: text"
    )
    compared.set_defaults(command_function=compare_runs)
