"""The report's charts on real runs: Keras, Lightning, and a torch run that tries to break them.

Each scenario is one training script run in a fresh interpreter, then ``cirron report``;
the assertions read the figures the report hands to plotly (the JSON of each
``Plotly.newPlot`` call) and, for the hostile run, the page as Chromium renders it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from support import clean_environment

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EVIL = '<a href="x">evil</a><style>body{display:none}</style>'
EVIL_TEXT = '&lt;a href="x"&gt;evil&lt;/a&gt;&lt;style&gt;body{display:none}&lt;/style&gt;'

KERAS = """
    import numpy as np
    import keras
    import cirron as ci
    ci.profile()
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    y = x[:, :1] * 0.5 - x[:, 1:2]
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)  # 4 batches an epoch
"""

LIGHTNING = """
    import warnings
    warnings.simplefilter("ignore")
    import torch
    import lightning as L
    import cirron as ci
    ci.profile()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                           torch.nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=8))
"""

HOSTILE = """
    import math
    import torch
    import cirron as ci
    ci.profile()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    EVIL = @EVIL@

    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(12)])
            self.frozen = torch.nn.Linear(4, 1)  # set to a constant below
            self.broken = torch.nn.Linear(2, 2)  # NaN below

        def forward(self, x):  # neither is in the forward pass: training goes on unharmed
            return self.layers(x)[:, :1]

    model = Wide()
    ci.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    for epoch in ci.epochs(range(3)):
        with torch.no_grad():
            model.frozen.weight.fill_(0.5 if epoch < 2 else 3.0)
            if epoch == 1:
                model.broken.weight.fill_(math.nan)
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark(EVIL, loss.item())
        ci.mark(EVIL, 1.0, kind="summary")
        ci.mark("epoch", epoch, kind="summary")  # what Lightning logs: the index again
        ci.mark("val_loss", 1 / 3, kind="summary")
        ci.mark("tiny", 1.234567e-5, kind="summary")
""".replace("@EVIL@", repr(EVIL))


def report_of(directory: Path, script: str) -> str:
    """Run ``script`` in ``directory``, then ``cirron report``; the report's HTML."""
    (directory / "train.py").write_text(textwrap.dedent(script))
    environment = clean_environment(TF_CPP_MIN_LOG_LEVEL="3")
    trained = subprocess.run(
        [str(BIN / "python"), "train.py"], cwd=directory, env=environment,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    reported = subprocess.run(
        [str(BIN / "cirron"), "report", "-o", "report.html"], cwd=directory, env=environment,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert reported.returncode == 0, reported.stderr[-3000:]
    return (directory / "report.html").read_text()


def figures(report: str) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """chart id -> (traces, layout), as the report hands them to ``Plotly.newPlot``."""
    decoder = json.JSONDecoder()
    found = {}
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([\w-]+)-chart",\s*', report):
        traces, end = decoder.raw_decode(report, match.end())
        comma = re.compile(r",\s*").match(report, end)
        assert comma is not None
        layout, _end = decoder.raw_decode(report, comma.end())
        found[match.group(1)] = (traces, layout)
    return found


def mark_chart(charts: dict[str, Any], name_starts: str) -> tuple[list[dict], dict]:
    for chart_id, (traces, layout) in charts.items():
        if chart_id.startswith("mark-") and traces[0]["hovertext"].startswith(name_starts):
            return traces, layout
    raise AssertionError(f"no mark chart for {name_starts!r} in {sorted(charts)}")


def step_lines(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step-time chart's lines, not its points for the steps a finding names (a step
    more than 3x the median: on a loaded machine, any short step may be one)."""
    return [trace for trace in traces if not trace.get("name", "").endswith(" steps")]


def lines(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The traces that are data, not the NaN/Inf crosses."""
    return [trace for trace in traces if trace.get("yaxis") != "y2"]


class Elements(HTMLParser):
    """The links and the style sheets of a page, as a browser sees them."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.links: list[str | None] = []
        self.styles: list[str] = []
        self._tag = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag = tag
        if tag == "a":
            found = dict(attrs)
            self.links.append(found.get("href") or found.get("xlink:href"))

    def handle_data(self, data: str) -> None:
        if self._tag == "style":
            self.styles.append(data)


# -- Keras: batch indexes restart each epoch, the step axis does not ----------------------------
@pytest.fixture(scope="module")
def keras_report(tmp_path_factory) -> dict[str, Any]:
    pytest.importorskip("keras")
    return figures(report_of(tmp_path_factory.mktemp("keras"), KERAS))


def test_keras_step_times_run_over_both_epochs_without_restarting(keras_report):
    (trace,) = step_lines(keras_report["step-times"][0])
    assert trace["x"] == list(range(8))
    assert keras_report["step-times"][1]["xaxis"]["title"]["text"] == "step"


def test_keras_loss_is_drawn_at_the_step_it_was_recorded_in(keras_report):
    traces, layout = mark_chart(keras_report, "loss")
    assert traces[0]["x"] == list(range(8))
    assert layout["xaxis"]["title"]["text"] == "step"


# -- Lightning: forward and backward run inside optimizer_step ----------------------------------
@pytest.fixture(scope="module")
def lightning_report(tmp_path_factory) -> dict[str, Any]:
    pytest.importorskip("lightning")
    return figures(report_of(tmp_path_factory.mktemp("lightning"), LIGHTNING))


def test_lightning_breakdown_counts_forward_and_backward(lightning_report):
    bars = {trace["name"]: trace for trace in lightning_report["breakdown"][0]}
    assert {"data_load", "forward", "backward", "optimizer_step", "other"} <= set(bars)
    for part in ("forward", "backward", "optimizer_step"):
        assert len(bars[part]["y"]) == 2 and all(ms > 0 for ms in bars[part]["y"]), part
    assert bars["forward"]["x"] == ["epoch 0", "epoch 1"]  # one process: no label needed


def test_lightning_steps_are_numbered_across_epochs(lightning_report):
    (trace,) = step_lines(lightning_report["step-times"][0])
    assert trace["x"] == list(range(8))


# -- a run that tries to break the report -------------------------------------------------------
@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("hostile")
    return directory, report_of(directory, HOSTILE)


def test_many_tensors_draw_the_eight_that_changed_most_and_sum_up_the_rest(hostile):
    charts = figures(hostile[1])
    for chart_id in ("norms", "gradient-norms"):
        assert 1 <= len(lines(charts[chart_id][0])) <= 8, chart_id
    assert re.search(r"Weight norm per tensor \(8 that changed most, and 20 more", hostile[1])
    drawn = {trace["name"] for trace in lines(charts["norms"][0])}
    assert {"broken.weight", "frozen.weight"} <= drawn  # NaN first, then a 500% change


def test_a_nan_tensor_is_a_marked_gap_not_a_norm_of_zero(hostile):
    traces = figures(hostile[1])["norms"][0]
    (broken,) = [trace for trace in traces if trace["name"] == "broken.weight"]
    assert broken["x"] == [0, 1, 2]
    assert broken["y"][0] > 0 and broken["y"][1:] == [None, None]
    (crosses,) = [trace for trace in traces if trace.get("yaxis") == "y2"]
    assert crosses["x"] == [1, 2] and all("NaN" in text for text in crosses["hovertext"])


def test_histograms_draw_a_constant_tensor_as_one_bar_and_skip_a_nan_one(hostile):
    report = hostile[1]
    bars = {trace["name"]: trace for trace in figures(report)["histograms"][0]}
    constant = bars["frozen.weight (epoch 2)"]
    assert constant["x"] == [3.0] and constant["y"] == [4] and constant["width"][0] > 0
    assert not any(name.startswith("broken.weight") for name in bars)
    assert re.search(
        r"Not drawn, with no finite value in the latest snapshot: broken\.weight", report
    )


def test_findings_show_severity_and_next_step_and_link_to_anchors_of_the_page(hostile):
    report = hostile[1]
    findings = re.search(r"<ul id='findings'>(.*?)</ul>", report, re.S)
    assert findings is not None
    nan = re.search(r'<li class="error">(.*?)</li>', findings.group(1))
    assert nan is not None and "the first with NaN or Inf values (first: broken.weight)" in nan[1]
    assert "pid " not in nan[1]  # one process: no finding names it
    assert 'href="#norms"' in nan[1] and "next: look at the steps of that epoch" in nan[1]
    anchors = set(re.findall(r"""id=['"]([\w-]+)['"]""", report))
    assert {"marks", "norms", "step-times", "stalls"} <= anchors
    assert set(re.findall(r'href="#([\w-]+)"', findings.group(1))) <= anchors


def test_summary_table_has_one_epoch_column_and_significant_digits(hostile):
    table = re.search(r'<table id="summary">(.*?)</table>', hostile[1], re.S)
    assert table is not None
    head = re.findall(r"<th[^>]*>(.*?)</th>", table.group(1))
    assert head.count("epoch") == 1 and "epoch (mark)" not in head
    assert "<td>0.3333</td>" in table.group(1) and "<td>1.23e-05</td>" in table.group(1)


def test_names_reach_plotly_as_text_shortened_with_the_full_name_on_hover(hostile):
    traces, layout = mark_chart(figures(hostile[1]), EVIL_TEXT[:20])
    assert layout["xaxis"]["title"]["text"] == "step"
    assert traces[0]["x"] == list(range(12))  # 4 steps an epoch, 3 epochs
    name = traces[0]["name"]
    assert name.endswith("…") and "<" not in name and name.startswith("&lt;a href=")
    assert traces[0]["hovertext"] == EVIL_TEXT


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh installs it)"
)
def test_a_hostile_mark_name_renders_as_text_in_the_browser(hostile, tmp_path):
    directory, _report = hostile
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--virtual-time-budget=10000", f"--user-data-dir={tmp_path / 'profile'}",
    ]  # fmt: skip
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", (directory / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert 'class="main-svg"' in dom  # plotly drew
    page = Elements(dom)
    assert "x" not in page.links
    assert page.styles and not any("body{display:none}" in style for style in page.styles)
    assert EVIL_TEXT in dom  # a title and the table head show the name as text
    # Plotly shows it as text too (the axis title), and once: not as "&lt;a" on the screen.
    assert re.search(r'class="ytitle"[^>]*>&lt;a href="x"&gt;evil', dom)


# -- memory and CPU per step ---------------------------------------------------------------------
LEAKING = """
    import torch
    import cirron as ci
    ci.profile(config={"step_resources_interval": 0})  # every step measured: the chart plots each
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    kept = []
    for epoch in range(3):
        kept.append(b"\\x01" * (64 << 20))  # 64 MB more at each epoch, every page written
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
"""


def test_memory_per_step_shows_each_epochs_64_mb_as_a_stair(tmp_path):
    charts = figures(report_of(tmp_path, LEAKING))
    (rss,), layout = charts["resources"]
    assert rss["hovertext"] == "host RSS" and rss["x"] == list(range(12))
    by_epoch = [rss["y"][i * 4 : (i + 1) * 4] for i in range(3)]
    assert 62 <= min(by_epoch[1]) - max(by_epoch[0]) <= 70  # MB
    assert 62 <= min(by_epoch[2]) - max(by_epoch[1]) <= 70
    assert [shape["x0"] for shape in layout["shapes"]] == [3.5, 7.5]  # where epochs begin
    (cpu,), _layout = charts["cpu"]
    assert len(cpu["y"]) == 12 and all(0 <= share <= 105 for share in cpu["y"])
