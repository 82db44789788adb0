"""The report of a long run stays small and keeps its anomalies: opened in a real browser
(Chromium), its step chart is a band of buckets with the slow steps marked."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from support import cirron

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
STEPS = 30_000


@pytest.fixture(scope="module")
def long_spool(tmp_path_factory) -> Path:
    """A synthetic spool of a plain torch loop of 30,000 steps, every 997th five times slower
    (the benchmark's: written directly, with its index, as cirron writes them)."""
    from benchmarks.long_runs import SLOW_EVERY, write_spool

    folder = tmp_path_factory.mktemp("long-report")
    write_spool(folder / ".cirron", STEPS)
    assert STEPS // SLOW_EVERY == 30
    return folder


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh installs it)"
)
def test_a_long_runs_report_is_small_and_shows_its_slow_steps(long_spool, tmp_path):
    report = tmp_path / "report.html"
    result = cirron("report", "-o", str(report), cwd=long_spool)
    assert result.returncode == 0, result.stderr
    assert f"report of {5 * STEPS + STEPS // 1000 + 1:,} spans" in result.stderr  # steps, epochs
    assert report.stat().st_size < 10 * 2**20
    text = report.read_text()
    assert "30 steps took more than 3x the median step" in text
    from benchmarks.long_runs import chromium_dom

    dom = chromium_dom(report, tmp_path / "profile", timeout=180)
    chart = dom.split('id="step-times-chart"', 1)[1].split('id="stalls-chart"', 1)[0]
    # Drawn: the band, the bucket medians, and the 30 slow steps as markers of their own.
    assert "(lowest to highest)" in chart and "(median)" in chart
    assert "slow steps" in chart
    markers = re.findall(r'class="point"', chart)
    assert len(markers) >= 30


def test_the_report_of_64_ranks_stays_small_and_keeps_the_slowest_rank_in_sight(tmp_path):
    """64 ranks of 1,000 steps: each chart's lines share its points, the heat map's cells
    are the slowest step of their columns (the last rank is the slowest, by 63 us a step)."""
    from benchmarks.long_runs import write_spool

    write_spool(tmp_path / ".cirron", 1000, ranks=64)
    report = tmp_path / "report.html"
    result = cirron("report", "-o", str(report), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.stat().st_size < 10 * 2**20
    text = report.read_text()
    assert "Each column is 4 steps, each cell the slowest of them." in text  # 16,000 cells
    assert "rank 63 was the slowest in 100% of" in text
