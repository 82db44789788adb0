"""``cirron compare A B`` (and ``cirron report A B``) on runs whose difference is known:
tests/scripts/known_run.py with its step made slower on purpose, or the same run twice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import support
from support import clean_environment

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
BIN = Path(sys.executable).parent
KNOWN_RUN = Path(__file__).parent / "scripts" / "known_run.py"


def known_run(directory: Path, *flags: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [str(BIN / "python"), str(KNOWN_RUN), *flags], cwd=directory,
        env=clean_environment(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


def cirron(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return support.cirron(*arguments, cwd=directory, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a``: 30 steps of 10 ms; ``b``: the same, each step 2 ms (20 %) slower.

    On the known clock: a step lasts the work it declares, however busy the machine is (timed
    by the wall clock, a loaded machine stretched both runs' overhead alike and shrank the 20 %
    to 2-6 %)."""
    root = tmp_path_factory.mktemp("compare")
    for run, milliseconds in (("a", "10"), ("b", "12")):
        known_run(root / run, "--steps", "30", "--compute-ms", milliseconds, "--known-clock",
                  "--mark", "batch_size", "1")  # fmt: skip
    return root


def test_a_run_compared_with_itself_gives_ratios_of_one_and_exit_0(runs):
    result = cirron(runs, "compare", "a/.cirron", "a/.cirron", "--threshold", "5%")
    assert result.returncode == 0, result.stdout + result.stderr
    ratios = re.findall(r" (\d+\.\d\d)$", result.stdout, re.M)
    assert ratios and set(ratios) == {"1.00"}, result.stdout
    assert "B is as fast as A at the median step: passed, not slower" in result.stdout


def test_a_faster_b_passed_the_threshold_rather_than_being_within_it(runs):
    result = cirron(runs, "compare", "b/.cirron", "a/.cirron", "--threshold", "5%")
    assert result.returncode == 0, result.stdout + result.stderr
    said = r"B is 1[67]\.\d% faster than A at the median step: passed, not slower \(the 5% "
    assert re.search(said + r"threshold limits a slowdown\)\.", result.stdout), result.stdout


def test_a_step_20_percent_slower_exits_non_zero_at_a_10_percent_threshold(runs):
    result = cirron(runs, "compare", "a/.cirron", "b/.cirron", "--threshold", "10%")
    assert result.returncode == 1, result.stdout + result.stderr
    slower = float(re.search(r"B is ([\d.]+)% slower than A", result.stdout).group(1))
    assert 19 <= slower <= 21, result.stdout
    assert "over the 10% threshold" in result.stdout
    assert cirron(runs, "compare", "a/.cirron", "b/.cirron", "--threshold", "50%").returncode == 0


def test_compare_as_json_has_every_figure_with_its_ratio(runs):
    result = cirron(runs, "compare", "a/.cirron", "b/.cirron", "--format", "json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    figures = {f["figure"]: f for f in found["figures"]}
    assert figures["step, median"]["ratio"] == pytest.approx(1.2, abs=0.01)
    assert figures["steps/s"]["ratio"] < 1.0
    assert figures["samples/s"]["a"] == pytest.approx(figures["steps/s"]["a"])  # batch 1
    assert figures["host memory peak"]["a"] > 0
    assert figures["loss, first"]["a"] == figures["loss, first"]["b"]  # the same seed
    assert found["over_threshold"] is False and found["threshold"] is None


def test_two_runs_of_one_folder_by_number(tmp_path):
    known_run(tmp_path, "--steps", "8", "--compute-ms", "1")
    known_run(tmp_path, "--steps", "8", "--compute-ms", "1")
    result = cirron(tmp_path, "compare", "1", "2")
    assert result.returncode == 0, result.stderr
    assert ".cirron, run 1" in result.stdout and ".cirron, run 2" in result.stdout
    wrong = cirron(tmp_path, "compare", "1", "7")
    assert wrong.returncode == 2 and "'7' is no spool folder, nor one run in" in wrong.stderr


def test_a_run_without_steps_is_a_clear_line(tmp_path):
    known_run(tmp_path / "a", "--steps", "5")
    known_run(tmp_path / "b", "--steps", "0")
    result = cirron(tmp_path, "compare", "a/.cirron", "b/.cirron")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "recorded no steps: nothing to compare" in result.stderr


def test_the_report_takes_two_runs(runs, tmp_path):
    pytest.importorskip("plotly")
    page = tmp_path / "two.html"
    result = cirron(runs, "report", "a/.cirron", "b/.cirron", "-o", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert "id='comparison'" in text and "step, median" in text
    assert "<p>A: run " in text and "<br>B: run " in text  # each run named once ("A: A:" was)


def test_a_share_difference_reads_as_the_shares_shown():
    from cirron.offline.compare import Line, ratio_text, shown

    line = Line("input-bound share", 0.01669, 0.01224, "share")  # shown as 2% and 1%
    assert (shown(line.a, "share"), shown(line.b, "share"), ratio_text(line)) == (
        "2%",
        "1%",
        "-1 pts",
    )  # not "-0 pts"
