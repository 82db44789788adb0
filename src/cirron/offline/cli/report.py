"""``cirron report``: an offline HTML page of a run's findings and charts, or of two runs
compared."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ...exporters import files
from .common import RUN_HELP, check_output, chosen_runs, default_folder, path_argument
from .compare import FOLDER_HELP, summaries


def report(arguments: argparse.Namespace) -> int:
    from ..report import build

    check_output(arguments.output)
    if arguments.other is not None:
        return report_two(arguments)
    chosen = chosen_runs(arguments, steps=True)
    count = sum(run.span_count for run in chosen)
    page = build(chosen, f"cirron run report: {os.path.abspath(arguments.path)}")
    files.write_output(arguments.output, lambda stream: stream.write(page))
    print(f"cirron: report of {count:,} spans written to {arguments.output}", file=sys.stderr)
    return 0


def report_two(arguments: argparse.Namespace) -> int:
    """``cirron report A B``: the comparison first, then both runs' findings and charts."""
    from ..report import build

    if arguments.run is not None:
        raise argparse.ArgumentTypeError("--run picks one run; with two runs, name each by itself")
    a, b, where = summaries(arguments, arguments.path, arguments.other)
    page = build([a.run, b.run], f"cirron: {where[0]} against {where[1]}", (a, b, where))
    files.write_output(arguments.output, lambda stream: stream.write(page))
    print(f"cirron: report of two runs written to {arguments.output}", file=sys.stderr)
    return 0


def add_parser(commands: Any) -> None:
    reported = commands.add_parser("report", help="write an offline HTML report of the run(s)")
    path_argument(reported)
    reported.add_argument(
        "other",
        nargs="?",
        help="a second run: the report compares the two (each run as `cirron compare` takes it)",
    )
    reported.add_argument("-o", "--output", default="report.html", help="default: report.html")
    reported.add_argument("--run", help=RUN_HELP)
    reported.add_argument("--folder", default=default_folder(), help=FOLDER_HELP)
    reported.set_defaults(command_function=report)
