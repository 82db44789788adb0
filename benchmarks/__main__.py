"""Run every benchmark and print one table: ``python -m benchmarks [--quick]``."""

from __future__ import annotations

import argparse
import os
import platform

from . import hot_path, torch_steps


def _us(nanoseconds: float) -> str:
    return f"{nanoseconds / 1000:.2f} us"


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
    except ImportError:
        print("(torch is not installed: torch rows skipped)")
    header = f"{'operation':<22} {'cirron':>10}  {'baseline (same run)':<28} {'baseline':>10} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for operation, ours, baseline_name, baseline in rows:
        ratio = f"{ours / baseline:.2f}x" if baseline else "-"
        print(
            f"{operation:<22} {_us(ours):>10}  {baseline_name:<28} {_us(baseline):>10} {ratio:>7}"
        )


if __name__ == "__main__":
    main()
