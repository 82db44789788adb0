"""``cirron report``: the HTML report of real profiled runs, opened in a real browser (Chromium)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import clean_environment

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

TRAIN = """
    import torch
    import cirron as ci
    ci.profile()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ci.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    for epoch in ci.epochs(range(3)):
        for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8)):
            if epoch == 1 and step == 3:
                with torch.no_grad():
                    model[0].weight[0, 0] = float("nan")
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark("lr", 0.1)
        ci.mark("epoch_loss", 0.5 / (epoch + 1), kind="summary")
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Two ranks of one run, spooled into one directory."""
    directory = tmp_path_factory.mktemp("report")
    (directory / "train.py").write_text(textwrap.dedent(TRAIN))
    for rank in (0, 1):
        result = subprocess.run(
            [str(BIN / "python"), "train.py"],
            cwd=directory,
            env=clean_environment(RANK=str(rank), CIRRON_RUN_ID="report-run"),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return directory


def cirron(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "cirron"), *arguments], cwd=cwd, env=clean_environment(), capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip


def test_show_diagnose_prints_the_findings(run):
    result = cirron("show", "--diagnose", cwd=run)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("rank 0: " in line and "waiting for data" in line for line in lines)
    assert any("rank 1: " in line and "waiting for data" in line for line in lines)
    assert any(re.search(r"^\w+ +rank \d was the slowest in \d+% of", line) for line in lines)
    assert any(re.search(r"rank \d: the snapshot of epoch 1 is the first with NaN or Inf", line)
               for line in lines)  # fmt: skip


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh installs it)"
)
def test_the_report_opens_offline_in_a_browser_with_its_charts_and_findings(run, tmp_path):
    report = tmp_path / "report.html"
    result = cirron("report", "-o", str(report), cwd=run)
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    after_bundle = text.split("</script>", 1)[1]  # plotly.js is inlined first
    assert not re.search(r"<script[^>]*\ssrc=|<link", after_bundle)  # nothing fetched
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--virtual-time-budget=10000",
    ]  # fmt: skip
    dom = subprocess.run(
        [CHROMIUM, *flags, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         report.as_uri()],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    # Plotly drew the charts in the browser: each one a plot container with SVG inside.
    charts = re.findall(r'<div id="([\w-]+)-chart" class="plotly-graph-div[^"]*js-plotly-plot', dom)
    assert {"step-times", "stalls", "breakdown", "mark-0", "norms", "histograms"} <= set(charts)
    assert dom.count('class="main-svg"') >= 2 * len(charts)
    findings = re.search(r"<ul id=\"findings\">(.*?)</ul>", dom, re.S)
    assert findings is not None and "snapshot of epoch 1" in findings.group(1)
    # Each finding links to the chart it is about (which ones there are depends on timing).
    links = re.findall(r'href="#([\w-]+)"', findings.group(1))
    assert "norms" in links
    assert all(f'id="{link}"' in dom for link in links), links
    assert '<table id="summary">' in dom and "epoch_loss" in dom
    screenshot = tmp_path / "report.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,2400",
         f"--screenshot={screenshot}", report.as_uri()],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert screenshot.stat().st_size > 10_000


def test_a_short_runs_report_names_its_run_and_says_its_steps_are_measured_on_a_cadence(run):
    page = run / "one.html"
    result = cirron("report", "-o", str(page), cwd=run)
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    # which of the folder's runs is shown
    assert re.search(r"<p id='run'>Run <code>report-run</code>, started 20\d\d-", text)
    # 24 short steps a rank, a few measured: the charts say why they have a few dots only
    found = re.search(r"Measured on (\d+) of 48 steps: steps are measured on a cadence", text)
    assert found and 2 <= int(found.group(1)) < 48, text[-3000:]
