"""Run every benchmark and print one table: ``python -m benchmarks [--quick]``."""

from __future__ import annotations

import argparse
import os
import platform
import time

from . import hot_path, keras_fit, process_costs, reference, snapshots, torch_steps
from .table import print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few rounds: checks it still runs")
    args = parser.parse_args()
    started = time.monotonic()
    python = reference.reference_python()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f} at start; "
        "CPU time of the calling thread, median of interleaved rounds, empty-loop baseline "
        "subtracted"
    )
    print(
        f"reference SDK: cirron-sdk {reference.VERSION} at {python}, the same code in its own "
        "processes, alternating with ours"
        if python
        else "reference SDK: not installed (bash scripts/reference-venv.sh): its columns are -"
    )
    rows = hot_path.run(quick=args.quick)
    try:
        rows += torch_steps.run(quick=args.quick)
        rows += snapshots.run(quick=args.quick)  # training-thread hold at an epoch boundary
    except ImportError:
        print("(torch is not installed: torch rows skipped)")
    try:
        rows += keras_fit.run(quick=args.quick)
    except ImportError:
        print("(keras is not installed: Keras rows skipped)")
    rows += process_costs.run(quick=args.quick)
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    print(f"took {minutes} min {seconds} s, load average {os.getloadavg()[0]:.2f} at the end")
    name = f"reference {reference.VERSION}" if python else "reference"
    print_table(rows, name)


if __name__ == "__main__":
    main()
