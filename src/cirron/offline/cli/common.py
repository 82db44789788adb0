"""What the ``cirron`` commands share: finding the spool, reading its runs, picking one with
``--run``, and the arguments every command takes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ...exporters import spool_reader
from ...exporters.lines import format_duration
from .. import reading, replay, runs

RUN_HELP = (
    "which run: N (1 the oldest, -1 the latest, as `cirron runs` numbers them), "
    "a run id or its first characters, or all (default: the latest)"
)


class SpoolError(Exception):
    """The spool directory itself can't be used (missing, empty)."""


class NothingMatches(Exception):
    """A filter (``--rank``, ``--name``) left nothing to show."""


def say_problem(problem: spool_reader.Problem) -> None:
    """A file that did not read, named on stderr (the others are still read)."""
    print(f"cirron: {problem}", file=sys.stderr)


def spool_files(path: str) -> list[str]:
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
            say_problem(read.problem)
        yield read.name, read.spans


def read_spans(path: str) -> list[Any]:
    """Every span of the spool at ``path``."""
    files = spool_files(path)
    spans: list[Any] = []
    with replay.progress(len(files), " files", minimum=20) as bar:
        for _name, read in _read(files):
            spans += read
            bar.update(1)
    return spans


def step_runs(path: str) -> list[runs.Run]:
    """The runs at ``path`` for a question about steps: their step rows from the index where
    it has them, and then not the spans of their parts (:mod:`cirron.offline.reading`)."""
    files = spool_files(path)
    with replay.progress(len(files), " files", minimum=20) as bar:
        return reading.read_runs(path, say_problem, bar.update)


def chosen_runs(arguments: argparse.Namespace, *, steps: bool = False) -> list[runs.Run]:
    """The runs ``--run`` picks (default: the latest), saying so when the folder holds more.
    ``steps``: for a question about steps (see :func:`step_runs`)."""
    every = step_runs(arguments.path) if steps else runs.runs_of(read_spans(arguments.path))
    chosen = pick(every, arguments)
    say_which(every, chosen, arguments)
    return chosen


def pick(every: list[runs.Listed], arguments: argparse.Namespace) -> list[runs.Listed]:
    """The runs of ``every`` that ``--run`` picks."""
    try:
        return runs.pick(every, arguments.run)
    except LookupError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def say_which(every: list[Any], chosen: list[Any], arguments: argparse.Namespace) -> None:
    """Say which run this is, when the folder holds more."""
    if len(every) > 1 and arguments.run != runs.ALL:
        numbers = ", ".join(str(every.index(run) + 1) for run in chosen)
        print(
            f"cirron: {len(every)} runs in {arguments.path}; this is run {numbers} "
            f"({'the latest' if arguments.run is None else 'as asked'}). "
            "`cirron runs` lists them; --run N|ID|all picks another.",
            file=sys.stderr,
        )


def chosen_spans(arguments: argparse.Namespace) -> list[Any]:
    """Every span of the runs ``--run`` picks."""
    return [span for run in chosen_runs(arguments) for span in run.spans]


def run_heading(run: runs.Run) -> str:
    """One line about a run: its id, framework, processes, steps and how it ended."""
    processes = ", ".join(process.label for process in run.processes)
    return (
        f"run {run.id[:16]} · {', '.join(run.frameworks) or 'no framework'} · {processes} · "
        f"{run.steps} steps · {format_duration(run.end_ns - run.start_ns)} · "
        f"{'failed' if run.failed else 'ok'}"
    )


def default_folder() -> str:
    """The cirron directory when none is named: ``$CIRRON_PATH``, else ``./.cirron``."""
    return os.environ.get("CIRRON_PATH") or ".cirron"


def path_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "path",
        nargs="?",
        default=default_folder(),
        help="the cirron directory (default ./.cirron, or $CIRRON_PATH), its spool folder, "
        "or one spool file",
    )


def check_output(path: str) -> None:
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
