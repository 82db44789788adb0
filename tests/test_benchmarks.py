from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_benchmark_suite_still_runs_in_quick_mode(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for row in (
        "empty ci.scope",
        "ci.mark point",
        "ci.batches per item",
        "disabled ci.scope",
        "MLP 3x512 step",
        "added per step, 401 modules",
        "snapshot hold, stats, tiny params",
        "snapshot hold, sampled, tiny params",
    ):
        assert row in result.stdout
