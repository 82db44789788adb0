from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROWS = (
    "empty ci.scope",
    "ci.mark point",
    "ci.batches per item",
    "disabled ci.scope",
    "MLP 3x512 step",
    "added by the hooks",
    "added per step, 401 modules",
    "snapshot hold, stats, tiny params",
    "snapshot hold, sampled, tiny params",
    "sustained span, spool",
    "spans dropped",
    "CPU per span kept",
    "peak RSS, 50,000 scope+mark",
    "ci.profile() after torch",
)


def _run(code: list[str], timeout: float = 300, **environment: str) -> str:
    result = subprocess.run(
        [sys.executable, *code],
        cwd=ROOT,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _reference_cells(output: str, row: str) -> list[str]:
    """The reference SDK's figure and our ratio to it, as printed in ``row``'s line."""
    line = next(line for line in output.splitlines() if line.strip().startswith(row))
    return line.split("|")[-1].split()


@pytest.mark.slow
def test_the_benchmark_suite_still_runs_in_quick_mode():
    # Every benchmark at its smallest: about 4 min on a quiet two-core machine, and up to twice
    # that beside the other test process (the limit is for a hang, not a speed).
    output = _run(["-m", "benchmarks", "--quick"], timeout=900)
    for row in ROWS:
        assert row in output
    if "reference SDK: not installed" not in output:  # every row compares with the reference
        for row in ROWS:
            assert _reference_cells(output, row)[0] != "-", row


@pytest.mark.slow
def test_rows_show_a_dash_where_the_reference_sdk_is_not_installed():
    code = (
        "from benchmarks import hot_path\n"
        "from benchmarks.table import print_table\n"
        "print_table(hot_path.run(quick=True), 'reference')\n"
    )
    output = _run(["-c", code], CIRRON_REFERENCE_PYTHON="")
    for row in ("empty ci.scope", "ci.mark point", "ci.batches per item", "disabled ci.scope"):
        assert _reference_cells(output, row) == ["-", "-"]


def test_the_interval_of_a_median_is_the_order_statistics_a_fair_coin_gives():
    from benchmarks.table import median_interval

    assert median_interval(range(5)) is None  # too few for 95 %
    assert median_interval(range(6)) == (0, 5)
    assert median_interval(range(30)) == (9, 20)  # the textbook ranks 10 and 21
    assert median_interval(reversed(range(100))) == (39, 60)
