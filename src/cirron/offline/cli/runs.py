"""``cirron runs``: one line a run in the folder, oldest first, from the spool's index."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ...exporters.lines import format_duration
from .. import run_index
from .common import path_argument, say_problem, spool_files

HEADING = (
    "  #  run               start                 duration  framework       processes"
    "          steps  status"
)


def list_runs(arguments: argparse.Namespace) -> int:
    """One line a run, from the spool's index (the files it has no line for are read)."""
    spool_files(arguments.path)  # a missing or empty spool is an error
    every = run_index.listed_runs(arguments.path, say_problem)
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


def add_parser(commands: Any) -> None:
    listed = commands.add_parser("runs", help="list the runs in the folder, oldest first")
    path_argument(listed)
    listed.set_defaults(command_function=list_runs)
