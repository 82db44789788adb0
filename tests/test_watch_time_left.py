"""``cirron watch`` says the time left where the run's length is known: HF's ``max_steps``,
Lightning's ``max_epochs``, Keras's ``epochs``. The run's plan reaches the spool's index
while the run goes on (each flush's line says what the open ``train`` span says), and the
watch works it out against the steps done and the recent pace.

Each run pauses part way (``scripts/planned_run.py``) and ``cirron watch --once`` looks at
it there, then the run goes on to its end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import Script, cirron, clean_environment, run_python

pytest.importorskip("torch")
PLANNED = Path(__file__).parent / "scripts" / "planned_run.py"


def watched_at_the_pause(tmp_path: Path, framework: str) -> tuple[str, str, list[dict]]:
    """What ``cirron watch --once`` shows at the pause and at the end, and the index lines
    written up to the pause."""
    with Script(PLANNED, framework, cwd=tmp_path, env=clean_environment()) as run:
        run.wait_for("PAUSED", timeout=120)
        paused = cirron("watch", "--once", cwd=tmp_path, timeout=60)
        assert paused.returncode == 0, paused.stderr
        (index,) = (tmp_path / ".cirron" / "index").glob("*.jsonl")
        lines = [json.loads(line) for line in index.read_text().splitlines()]
        (tmp_path / "go").touch()
        code, _out, err = run.finish(timeout=120)
        assert code == 0, err
    ended = cirron("watch", "--once", cwd=tmp_path, timeout=60)
    assert ended.returncode == 0, ended.stderr
    return paused.stdout.splitlines()[0], ended.stdout.splitlines()[0], lines


def test_an_hf_run_with_max_steps_shows_the_time_left_and_the_step_of_1000(tmp_path):
    pytest.importorskip("transformers")
    paused, ended, lines = watched_at_the_pause(tmp_path, "transformers")
    assert re.search(r"· time left [~<][\dsmhd ]+ \(step [\d,]+ of 1,000\) · running", paused)
    done = int(re.search(r"\(step ([\d,]+) of", paused)[1].replace(",", ""))
    assert 290 <= done <= 300  # (the step ending at the pause is written with the next one)
    assert "transformers" in paused  # the frameworks, while the run goes on
    assert lines[-1]["plan"] == {"max_steps": 1000}
    assert "transformers" in lines[-1]["frameworks"]
    assert "(step 1,000 of 1,000) · ended" in ended and "time left" not in ended


def test_a_lightning_run_of_5_epochs_shows_the_third_and_the_time_left(tmp_path):
    pytest.importorskip("lightning")
    paused, ended, lines = watched_at_the_pause(tmp_path, "lightning")
    # 8 steps an epoch, known from the first whole epoch: 40 steps in all
    assert re.search(r"· time left [~<][\dsmhd ]+ \(epoch 3 of 5\) · running", paused)
    assert lines[-1]["plan"]["max_epochs"] == 5 and lines[-1]["epoch"] == 2
    assert "40 steps" in ended and "(epoch 5 of 5) · ended" in ended


def test_a_keras_run_of_5_epochs_shows_the_third_and_the_time_left(tmp_path):
    pytest.importorskip("keras")
    paused, ended, lines = watched_at_the_pause(tmp_path, "keras")
    assert re.search(r"· time left [~<][\dsmhd ]+ \(epoch 3 of 5\) · running", paused)
    assert lines[-1]["plan"] == {"max_epochs": 5, "epoch_steps": 8}
    assert "(epoch 5 of 5) · ended" in ended


def test_a_run_of_unknown_length_shows_no_time_left_and_an_old_index_line_reads_as_before():
    from cirron.exporters import spool_index
    from cirron.offline.live import Followed, LiveRun
    from cirron.offline.live_figures import Figures, _progress
    from cirron.offline.live_view import heading

    line = {
        "v": 1,
        "file": "7-000001.json.gz",
        "spans": 3,
        "steps": 2,
        "batches": 0,
        "errors": 0,
        "start": 1_000,
        "end": 2_000_000_000,
        "first": [1_000, "ab" * 16],
        "sessions": [],
        "names": {"step": 2},
        "resource": {"process.pid": 7},
    }  # fmt: skip  (a line written before the plan, the epoch and the frameworks were)
    assert spool_index.well_formed(line)
    process = Followed(("7",), line["resource"], "pid 7", None, "run-1")
    process.add_line(line)
    assert process.plan == {} and process.epoch is None and process.frameworks == []
    figures = Figures("run-1", [], ["pid 7"], 2_000_000_000, 2, steps_per_s=1.0)
    _progress(figures, LiveRun("run-1", [process]))
    assert figures.left_ns is None and "time left" not in heading(figures)
    assert "(step" not in heading(figures) and "(epoch" not in heading(figures)
    process.add_line(line | {"plan": {"max_steps": 10}, "epoch": 0, "frameworks": ["torch"]})
    _progress(figures, LiveRun("run-1", [process]))
    assert process.frameworks == ["torch"]
    assert "time left ~6s (step 4 of 10)" in heading(figures)  # 6 steps left at 1 a second


def test_a_time_left_reads_as_a_person_says_it():
    from cirron.offline.live_view import time_left

    seconds = 1_000_000_000
    assert time_left(seconds // 2) == "<1s"
    assert time_left(45 * seconds) == "~45s"
    assert time_left(12 * 60 * seconds) == "~12m"
    assert time_left((3 * 3600 + 20 * 60) * seconds) == "~3h 20m"
    assert time_left((2 * 86400 + 5 * 3600) * seconds) == "~2d 5h"


def test_open_spans_that_cannot_be_read_cost_the_index_its_plan_only(tmp_path):
    code = """
        import cirron as ci
        profiler = ci.profile(flush_interval=60)
        (spool,) = [w.exporter for w in profiler.workers if w.name == "spool"]
        def broken():
            raise RuntimeError("no open spans today")
        spool.index_writer.open_spans = broken
        for epoch in ci.epochs(range(2)):
            for batch in ci.batches(range(5)):
                pass
            ci.flush()
        print("INDEX ERRORS", ci.health()["spool_index_errors"])
    """
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cannot read the open spans for the spool's index") == 1
    assert "INDEX ERRORS 1" in result.stdout
    shown = cirron("runs", cwd=tmp_path)
    assert shown.returncode == 0 and " 10  ok" in shown.stdout, shown.stdout


def test_a_run_resumed_from_a_checkpoint_counts_its_steps_from_the_checkpoints():
    from cirron.offline.live import Followed, LiveRun
    from cirron.offline.live_figures import Figures, _progress
    from cirron.offline.live_view import heading

    process = Followed(("7",), {"process.pid": 7}, "pid 7", None, "run-1", steps=100)
    process.plan = {"max_steps": 1000}
    process.last_step_index = 699  # HF's global step: 600 done before, 100 since the resume
    figures = Figures("run-1", [], ["pid 7"], 10_000_000_000, 100, steps_per_s=10.0)
    _progress(figures, LiveRun("run-1", [process]))
    assert "time left ~30s (step 700 of 1,000)" in heading(figures)
