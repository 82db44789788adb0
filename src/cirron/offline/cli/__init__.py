"""The ``cirron`` command (also ``python -m cirron``): a spool directory, on its own.

::

    cirron runs [PATH]
    cirron watch [PATH] [--run N|ID] [--interval SECONDS] [--plain] [--once]
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

One module a command (``show``, ``runs``, ``watch``, ``report``, ``compare``, ``export``), each
with its function and its ``add_parser``; what they share is in :mod:`.common`.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from ...otel.version import __version__
from .. import compare as comparing
from . import compare, export, report, runs, show, watch
from .common import NothingMatches, SpoolError


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="cirron", description="Read and replay the spool of profiled runs."
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers(dest="command", required=True)
    show.add_parser(commands)
    runs.add_parser(commands)
    watch.add_parser(commands)
    report.add_parser(commands)
    compare.add_parser(commands)
    export.add_parser(commands)
    return top


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
            export.header(text)
        return int(arguments.command_function(arguments))
    except (argparse.ArgumentTypeError, SpoolError, comparing.NothingToCompare) as error:
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
