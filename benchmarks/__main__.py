"""Run every benchmark and print one table: ``python -m benchmarks [--quick]``."""

from __future__ import annotations

import argparse
import os
import platform

from . import hot_path, process_costs, snapshots, torch_steps


def _format(value: float, unit: str) -> str:
    """``value`` is in ns for ``us`` rows, else already in ``unit``."""
    if unit == "us":
        return f"{value / 1000:.2f} us"
    return f"{value:.2f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few rounds: checks it still runs")
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; CPU time of the calling thread, "
        "median of interleaved rounds, empty-loop baseline subtracted"
    )
    rows = hot_path.run(quick=args.quick)
    try:
        rows += torch_steps.run(quick=args.quick)
        rows += snapshots.run(quick=args.quick)  # training-thread hold at an epoch boundary
    except ImportError:
        print("(torch is not installed: torch rows skipped)")
    rows += process_costs.run(quick=args.quick)
    header = f"{'operation':<34} {'cirron':>10}  {'baseline (same run)':<36} {'baseline':>10} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for operation, ours, baseline_name, baseline, *unit in rows:
        ratio = f"{ours / baseline:.2f}x" if baseline else "-"
        ours_text, baseline_text = (_format(v, unit[0] if unit else "us") for v in (ours, baseline))
        print(
            f"{operation:<34} {ours_text:>10}  {baseline_name:<36} {baseline_text:>10} {ratio:>7}"
        )


if __name__ == "__main__":
    main()
