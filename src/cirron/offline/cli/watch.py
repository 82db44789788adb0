"""``cirron watch``: a live view of a run while it trains, from another terminal.

Once a second (``--interval``) it reads what the run appended to its spool's index since
the last look (:mod:`cirron.offline.live`) and redraws the figures (:mod:`cirron.offline.
live_figures`): no connection to the training process, and nothing added to its cost.
Without ``--run`` it follows the newest run that has not ended, and waits for one when
there is none; ``--run ID`` naming a run that has not begun yet waits for it. When the run
ends (each process closed its session, or is gone and nothing came for a while) the view
gives way to the run's summary and the command exits with 0; Ctrl-C stops watching at any
time (the run goes on). Without a terminal (``| cat``, CI) it
prints a plain line a refresh instead of the view.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ...exporters import spool_reader
from .. import live_figures, live_view, runs
from ..live import IndexFollower, LiveRun
from .common import SpoolError, default_folder

MAX_INTERVAL = 3600.0


def watch(arguments: argparse.Namespace) -> int:
    if not 0 < arguments.interval <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"--interval must be seconds, more than 0 and at most {MAX_INTERVAL:.0f}, "
            f"got {arguments.interval}"
        )
    if arguments.run == runs.ALL:
        raise argparse.ArgumentTypeError("--run all: watch follows one run (N or an id)")
    path = arguments.path
    if os.path.isfile(path):
        raise SpoolError(f"{path} is a file: watch a cirron directory (default ./.cirron)")
    follower = IndexFollower(spool_reader.cirron_directory(path))
    follower.poll()
    if arguments.once:
        return _once(follower, arguments)
    passed_over = set() if arguments.run else {r.id for r in follower.runs() if _ended(r)}
    try:
        if sys.stdout.isatty() and not arguments.plain:
            return _live(follower, arguments, passed_over)
        return _plain(follower, arguments, passed_over)
    except KeyboardInterrupt:
        print("cirron: stopped watching (the run goes on)", file=sys.stderr)
        return 0


def _ended(run: LiveRun) -> str | None:
    return run.ended(time.time())


def _chosen(
    follower: IndexFollower, arguments: argparse.Namespace, passed_over: set[str]
) -> LiveRun | None:
    """The run to show: ``--run``'s, else the newest of those not over when watch began.

    ``--run`` naming an id that no run has yet (``CIRRON_RUN_ID=exp42``, watch started
    first) waits for it, unless ``--once``; a run's number that is not there is an error.
    """
    every = follower.runs()
    if arguments.run:
        try:
            return runs.pick(every, arguments.run)[0] if every else None
        except LookupError as error:
            if arguments.once or _is_number(arguments.run):
                raise argparse.ArgumentTypeError(str(error)) from None
            return None
    fresh = [run for run in every if run.id not in passed_over]
    return fresh[-1] if fresh else None


def _is_number(choice: str) -> bool:
    try:
        int(choice)
    except ValueError:
        return False
    return True


def _waiting(follower: IndexFollower, arguments: argparse.Namespace) -> str:
    every = follower.runs()
    if arguments.run:  # an id no run has yet: say which runs there are (a typo shows)
        known = ", ".join(run.id[:16] for run in every[-5:]) or "none yet"
        return (
            f"waiting for run {arguments.run!r} in {arguments.path} ... (the runs there: {known})"
        )
    said = f"waiting for a run in {arguments.path} ..."
    if every and not arguments.run:
        said += (
            f" (the latest, {every[-1].id[:16]}, has ended: `cirron watch --run -1` shows it, "
            "`cirron show --diagnose` reads it)"
        )
    return said


def _figures(follower: IndexFollower, run: LiveRun) -> live_figures.Figures:
    return live_figures.figures(run, follower, time.time_ns(), _ended(run))


def _live(follower: IndexFollower, arguments: argparse.Namespace, passed_over: set[str]) -> int:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    followed: str | None = None
    with Live(console=console, auto_refresh=False, transient=True) as live:
        while True:
            run = _run_of(follower, arguments, passed_over, followed)
            if run is None:
                live.update(Text(_waiting(follower, arguments)), refresh=True)
            else:
                followed = run.id
                figures = _figures(follower, run)
                if figures.ended:
                    break
                live.update(live_view.view(figures, arguments.path), refresh=True)
            _sleep(follower, arguments.interval)
    console.print(f"cirron: the run {figures.ended}.", markup=False, highlight=False)
    console.print(live_view.summary(figures, arguments.path), markup=False, highlight=False)
    return 0


def _plain(follower: IndexFollower, arguments: argparse.Namespace, passed_over: set[str]) -> int:
    followed: str | None = None
    said_waiting = False
    while True:
        run = _run_of(follower, arguments, passed_over, followed)
        if run is None:
            if not said_waiting:
                print(_waiting(follower, arguments), flush=True)
                said_waiting = True
        else:
            followed = run.id
            figures = _figures(follower, run)
            if figures.ended:
                print(f"the run {figures.ended}.")
                print(live_view.summary(figures, arguments.path), flush=True)
                return 0
            print(live_view.plain_line(figures), flush=True)
        _sleep(follower, arguments.interval)


def _run_of(
    follower: IndexFollower,
    arguments: argparse.Namespace,
    passed_over: set[str],
    followed: str | None,
) -> LiveRun | None:
    """The run followed since it was first shown, else the one to show now."""
    if followed is not None:
        for run in follower.runs():
            if run.id == followed:
                return run
    return _chosen(follower, arguments, passed_over)


def _sleep(follower: IndexFollower, interval: float) -> None:
    time.sleep(interval)
    follower.poll()


def _once(follower: IndexFollower, arguments: argparse.Namespace) -> int:
    """``--once``: the figures now, as the summary prints them, and no waiting."""
    run = _chosen(follower, arguments, set())
    if run is None:
        print(f"cirron: no run in {arguments.path} yet", file=sys.stderr)
        return 1
    figures = _figures(follower, run)
    print(live_view.summary(figures, arguments.path))
    return 0


def add_parser(commands: Any) -> None:
    watched = commands.add_parser(
        "watch",
        help="a live view of a run while it trains: steps, step time by part, marks, memory, "
        "ranks and findings, refreshed each second",
    )
    watched.add_argument(
        "path",
        nargs="?",
        default=default_folder(),
        help="the cirron directory (default ./.cirron, or $CIRRON_PATH), or its spool folder",
    )
    watched.add_argument(
        "--run",
        help="which run: N (1 the oldest, -1 the latest, as `cirron runs` numbers them) or a "
        "run id or its first characters (default: the newest run still going, waiting for one "
        "when none is)",
    )
    watched.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between refreshes (default 1)",
    )
    watched.add_argument(
        "--plain",
        action="store_true",
        help="a plain line a refresh, also in a terminal (the default without one)",
    )
    watched.add_argument(
        "--once",
        action="store_true",
        help="print the figures of the run as they are now, and exit",
    )
    watched.set_defaults(command_function=watch)
