"""Run every benchmark and print one table: ``python -m benchmarks [--quick] [--write-docs]``.

``--write-docs`` also writes each benchmark's rows as a markdown table,
``docs/benchmarks/<benchmark>.md``, which the documentation site's pages include: the
figures in the docs are the ones this run measured, and come from nowhere else.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path
from types import ModuleType

from . import (
    collectives,
    hot_path,
    inference,
    keras_fit,
    long_runs,
    metrics,
    peers,
    process_costs,
    reference,
    snapshots,
    torch_steps,
    watch,
)
from .table import Row, markdown_table, print_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def _machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


def _versions() -> str:
    """The framework versions the rows ran on, for the docs' provenance line."""
    found = []
    for name in ("torch", "keras", "tensorflow"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        found.append(f"{name} {module.__version__}")
    return ", ".join(found)


def _run_each(quick: bool, only: list[str] | None = None) -> dict[str, list[Row]]:
    """Every benchmark's rows (or ``only`` those named), by module name; a benchmark whose
    framework is missing is left out."""
    benchmarks: list[tuple[ModuleType, str]] = [
        (hot_path, ""),
        (torch_steps, "torch"),
        (snapshots, "torch"),  # training-thread hold at an epoch boundary
        (keras_fit, "keras"),
        (process_costs, ""),
        (metrics, ""),
        (inference, ""),  # its generate rows only where transformers is installed
        (collectives, "torch"),  # a collective span, a DDP bucket's
        (long_runs, ""),  # a synthetic spool read back: bytes a step, each command's cost
        (watch, "torch"),  # the MLP step with `cirron watch` attached, and without
        (peers, "TraceML / one-logger (bash scripts/peers-venvs.sh)"),  # the same MLP step
    ]
    names = [module.__name__.rpartition(".")[2] for module, _ in benchmarks]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise SystemExit(
            f"--only: no benchmark {', '.join(unknown)} (there are {', '.join(names)})"
        )
    results: dict[str, list[Row]] = {}
    for module, framework in benchmarks:
        if only and module.__name__.rpartition(".")[2] not in only:
            continue
        try:
            results[module.__name__.rpartition(".")[2]] = module.run(quick=quick)
        except ImportError:
            if not framework:
                raise
            print(f"({framework} is not installed: {module.__name__} rows skipped)")
    return results


def write_docs(results: dict[str, list[Row]], reference_name: str, provenance: str) -> None:
    """One markdown file per benchmark under docs/benchmarks/, included by the site's pages."""
    DOCS.mkdir(parents=True, exist_ok=True)
    for name, rows in results.items():
        text = (
            f"<!-- Written by `python -m benchmarks --write-docs` from benchmarks/{name}.py: "
            "do not edit by hand, run it again. -->\n\n"
            f"Measured by `benchmarks/{name}.py`: {provenance}.\n\n"
            + markdown_table(rows, reference_name)
        )
        (DOCS / f"{name}.md").write_text(text)
        print(f"wrote {DOCS / f'{name}.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds: checks it still runs")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="also write each benchmark's table to docs/benchmarks/<benchmark>.md",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run this benchmark alone (a module of benchmarks/: hot_path, torch_steps, ...); "
        "may be given more than once",
    )
    args = parser.parse_args()
    started = time.monotonic()
    load_at_start = os.getloadavg()[0]
    python = reference.reference_python()
    print(
        f"machine: {_machine()}, load average {load_at_start:.2f} at start; "
        "CPU time of the calling thread, median of interleaved rounds, empty-loop baseline "
        "subtracted"
    )
    print(
        f"reference SDK: cirron-sdk {reference.VERSION} at {python}, the same code in its own "
        "processes, alternating with ours"
        if python
        else "reference SDK: not installed (bash scripts/reference-venv.sh): its columns are -"
    )
    results = _run_each(args.quick, args.only)
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    load_at_end = os.getloadavg()[0]
    print(f"took {minutes} min {seconds} s, load average {load_at_end:.2f} at the end")
    name = f"reference {reference.VERSION}" if python else "reference"
    print_table([row for rows in results.values() for row in rows], name)
    if args.write_docs:
        provenance = (
            f"{_machine()}, {_versions()}, on {datetime.date.today().isoformat()}; "
            + ("a quick run (`--quick`: few rounds, small sizes)" if args.quick else "a full run")
            + f" of {minutes} min {seconds} s, load average {load_at_start:.2f} at its start "
            f"and {load_at_end:.2f} at its end"
        )
        write_docs(results, name, provenance)


if __name__ == "__main__":
    main()
