"""The ``cirron`` command on spool directories made by real profiled runs (real subprocesses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cirron.exporters import spool_files, spool_spans
from support import HF_TINY_TRAINER, cirron, clean_environment

try:
    from otlp_receiver import OtlpReceiver
except ImportError:  # pragma: no cover - run from the repository root
    from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent

TRAIN = """
    import sys
    import torch
    import cirron as ci
    ci.profile(flush_interval=0.05)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    ci.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    for epoch in range(2):
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss)
        ci.flush()
    ci.shutdown()
    print(ci.trace())
"""


def profiled_run(directory: Path, **extra: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    result = subprocess.run(
        [str(BIN / "python"), str(script)],
        cwd=directory,
        env=clean_environment(**extra),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def shape(text: str) -> list[str]:
    """The tree's lines without durations (they are the same spans, not the same digits)."""
    return [line.split(" - ")[0] + (" {" + line.split("{", 1)[1] if "{" in line else "")
            for line in text.splitlines()]  # fmt: skip


@pytest.fixture(scope="module")
def run_directory(tmp_path_factory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("run")
    return directory, profiled_run(directory)


def test_show_prints_the_tree_as_ci_trace_does(run_directory):
    directory, printed = run_directory
    result = cirron("show", cwd=directory)
    assert result.returncode == 0, result.stderr
    assert shape(result.stdout) == shape(printed.strip())
    assert result.stdout.startswith("cirron.session")


def test_show_filters_and_formats(run_directory):
    directory, _ = run_directory
    epochs = cirron("show", "--name", "epoch", "--format", "json", cwd=directory)
    nodes = json.loads(epochs.stdout)
    assert [n["index"] for n in nodes] == [0, 1]
    assert all(len([c for c in n["children"] if c["name"] == "step"]) == 4 for n in nodes)
    table = cirron("show", str(directory / ".cirron"), "--name", "step", "--format", "df-csv",
                   cwd=directory.parent)  # fmt: skip
    rows = table.stdout.strip().splitlines()
    assert rows[0].startswith("name,index,span_id,parent_id,depth")
    assert len(rows) == 1 + 8 and all(row.startswith("step,") for row in rows[1:])
    last = cirron("show", "--last", "1", cwd=directory)
    assert last.stdout.startswith("cirron.session")  # the session ended last


def test_two_ranks_show_as_two_trees_and_rank_picks_one(tmp_path):
    for rank in (0, 1):
        profiled_run(tmp_path / f"rank{rank}", RANK=str(rank), CIRRON_RUN_ID="cli-run")
    spool = tmp_path / "both" / "spool"
    spool.mkdir(parents=True)
    for rank in (0, 1):
        for name in os.listdir(tmp_path / f"rank{rank}" / ".cirron" / "spool"):
            shutil.copy(tmp_path / f"rank{rank}" / ".cirron" / "spool" / name, spool / name)
    both = cirron("show", str(tmp_path / "both"), cwd=tmp_path)
    assert both.stdout.count("cirron.session") == 2
    one = cirron("show", str(tmp_path / "both"), "--rank", "1", cwd=tmp_path)
    assert one.stdout.count("cirron.session") == 1 and one.stdout.count("epoch[") == 2


def test_a_corrupt_file_is_named_and_skipped_and_an_empty_directory_is_an_error(
    run_directory, tmp_path
):
    directory, _ = run_directory
    copy = tmp_path / "copy"
    shutil.copytree(directory / ".cirron", copy)
    first = sorted(spool_files(str(copy)))[0]
    Path(first).write_text('{"resourceSpans": [ truncated')
    result = cirron("show", str(copy), cwd=tmp_path)
    assert result.returncode == 0
    assert os.path.basename(first) in result.stderr and "skipping" in result.stderr
    assert "cirron.session" in result.stdout  # the other files still shown
    (tmp_path / "empty").mkdir()
    empty = cirron("show", str(tmp_path / "empty"), cwd=tmp_path)
    assert empty.returncode == 2 and "no spool files" in empty.stderr
    missing = cirron("show", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere" in missing.stderr


def test_help_on_every_subcommand(tmp_path):
    for arguments in ([], ["show"], ["export"]):
        result = cirron(*arguments, "--help", cwd=tmp_path)
        assert result.returncode == 0 and "usage: cirron" in result.stdout
    module = subprocess.run(
        [str(BIN / "python"), "-m", "cirron", "--help"], capture_output=True, text=True
    )
    assert module.returncode == 0 and "show" in module.stdout


def test_export_replays_every_span_exactly_once_across_an_interrupted_replay(
    run_directory, tmp_path
):
    directory, _ = run_directory
    spool = tmp_path / "replay"
    shutil.copytree(directory / ".cirron", spool)
    expected = {s["spanId"] for s in spool_spans(str(spool))}
    files = sorted(spool_files(str(spool)))
    assert len(files) >= 3
    later = tmp_path / "later"
    later.mkdir()
    for name in files[2:]:  # the replay is interrupted after two files ...
        shutil.move(name, later / os.path.basename(name))
    dead = cirron("export", str(spool), "--endpoint", "http://127.0.0.1:9", cwd=tmp_path)
    assert dead.returncode == 1 and "not sent: connection refused" in dead.stderr
    with OtlpReceiver(str(tmp_path / "rotel")) as receiver:
        first = cirron("export", str(spool), "--endpoint", receiver.http_endpoint, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        sent = int(first.stderr.split()[1])
        for name in os.listdir(later):  # ... and resumed once the rest is back
            shutil.move(later / name, spool / "spool" / name)
        second = cirron("export", str(spool), "--endpoint", receiver.http_endpoint, cwd=tmp_path)
        assert second.returncode == 0, second.stderr
        assert f"{len(expected) - sent} spans sent" in second.stderr
        assert f"{sent} it had already" in second.stderr
        again = cirron("export", str(spool), "--endpoint", receiver.http_endpoint, cwd=tmp_path)
        assert again.stderr.startswith("cirron: 0 spans sent")
        receiver.wait_for(lambda text: all(i in text for i in expected), timeout=30)
        received = [s["span_id"] for s in receiver.spans()]
    assert sorted(received) == sorted(expected)  # every span, each once


def test_export_chrome_writes_trace_events_perfetto_opens(run_directory, tmp_path):
    directory, _ = run_directory
    out = tmp_path / "trace.json"
    result = cirron("export", "--format", "chrome", "-o", str(out), cwd=directory)
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())  # strict JSON: no NaN
    events = document["traceEvents"]
    for event in events:  # the fields the Trace Event format requires
        assert {"name", "ph", "pid"} <= set(event)
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float))
        if event["ph"] == "X":
            assert event["dur"] >= 0 and "tid" in event
        if event["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values())
    kinds = {e["ph"] for e in events}
    assert kinds == {"X", "C", "i", "M"}
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"cirron.session", "epoch[0]", "step[0]", "forward"} <= names
    assert sum(e["ph"] == "C" and e["name"] == "loss" for e in events) == 8  # a counter track
    assert sum(e["ph"] == "i" and e["name"] == "snapshot" for e in events) == 2
    (process,) = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert "pid" in process["args"]["name"]
    missing = cirron("export", "--format", "chrome", cwd=directory)
    assert missing.returncode == 2 and "-o" in missing.stderr


def test_o_writes_through_a_symlink_and_into_a_pipe_as_a_shell_would(run_directory, tmp_path):
    directory, _ = run_directory
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "trace.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    result = cirron("export", "--format", "chrome", "-o", str(link), cwd=directory)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]
    assert target.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its permissions
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = tmp_path / "got.html"
    with got.open("w") as stream:  # a reader at the other end of the pipe
        reader = subprocess.Popen(["cat", str(fifo)], stdout=stream)
        report = cirron("report", "-o", str(fifo), cwd=directory)
        reader.wait(timeout=60)
    assert report.returncode == 0, report.stderr
    assert fifo.is_fifo() and "<html" in got.read_text().lower()  # written into, not replaced


HF_TRAIN = "import cirron as ci\nci.profile()\n" + HF_TINY_TRAINER


def test_an_hf_trainer_spool_shows_and_reports(tmp_path):
    (tmp_path / "train.py").write_text(HF_TRAIN)
    result = subprocess.run(
        [str(BIN / "python"), "train.py"], cwd=tmp_path, env=clean_environment(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = json.loads(cirron("show", "--name", "epoch", "--format", "json", cwd=tmp_path).stdout)
    assert [e["index"] for e in epochs] == [0, 1]
    assert all(len([c for c in e["children"] if c["name"] == "step"]) == 2 for e in epochs)
    assert any(m["name"] == "loss" and m["kind"] == "summary" for m in epochs[0]["marks"])
    diagnosis = cirron("show", "--diagnose", cwd=tmp_path)
    assert "waiting for data" in diagnosis.stdout
    report = cirron("report", "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert report.returncode == 0 and (tmp_path / "r.html").stat().st_size > 1_000_000
