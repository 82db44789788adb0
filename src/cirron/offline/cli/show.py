"""``cirron show``: the span tree of a run (an outline for a long one), ``--diagnose`` its
findings, ``--ranks`` its ranks lined up."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ...exporters import spool_reader
from ...otel import semconv
from .. import findings, outline, rank_findings, ranks, readback, run_index, runs, step_table
from .common import (
    RUN_HELP,
    NothingMatches,
    chosen_runs,
    chosen_spans,
    path_argument,
    pick,
    run_heading,
    say_problem,
    say_which,
    spool_files,
)


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
    spans = chosen_spans(arguments)
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
    spool_files(path)
    every = run_index.listed_runs(path)
    chosen = pick(every, arguments)
    steps = sum(run.steps for run in chosen)
    if steps <= outline.SHOWN_STEPS:
        return None
    keys = {runs.process_key_of(p.lines[0]["resource"]) for run in chosen for p in run.processes}
    tables = [t for t in step_table.step_tables(path, indexed_only=True) if t.key in keys]
    if len(tables) < len(keys):
        return None  # a process the index does not cover: every span
    say_which(every, chosen, arguments)
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
        sorted(set(names), key=spool_reader.spool_files_order), found, say_problem
    )
    return (
        f"(a run of {steps:,} steps, outlined: the first and last epochs and steps, and the "
        "failed, non-finite and slowest steps; --all prints every span)\n"
        + outline.render(spans, found)
    )


def diagnose(arguments: argparse.Namespace) -> int:
    every = chosen_runs(arguments, steps=True)
    for number, run in enumerate(every):
        if number:
            print()
        print(run_heading(run))
        for finding in findings.diagnose(run):
            print(f"{finding.severity:<8} {finding.text}")
            if finding.action:
                print(f"{'':<8} next: {finding.action}")
    return 0


# -- show --ranks -------------------------------------------------------------------------------
def show_ranks(arguments: argparse.Namespace) -> int:
    """A table per run: each rank's step time by part (median/p95), and the steps where it
    was the slowest; then the ranks' findings."""
    if arguments.format == "df-csv":
        raise argparse.ArgumentTypeError("--ranks prints --format text or json")
    chosen = chosen_runs(arguments, steps=True)
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


def add_parser(commands: Any) -> None:
    shown = commands.add_parser("show", help="print the span tree of the run(s)")
    path_argument(shown)
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
