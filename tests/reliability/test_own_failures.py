"""Promise 7: when cirron's own code fails, training goes on, the failure is counted and told once.

``scripts/own_failures.py`` breaks cirron from inside a real run: an exporter
that raises, an exporter that raises ``SystemExit`` (ending its thread), the
flush thread killed from outside, a torch hook that raises at every step. The
run trains to the end with the same results, ``ci.health()`` counts the
failures, the log gets one line, and a dead thread is replaced so export goes
on by itself. (Each torch hook failing in turn, in-process:
``tests/test_torch.py::test_a_failing_hook_does_not_change_training``.)
"""

from __future__ import annotations

import json

import pytest
from faults import SCRIPTS, assert_spool_intact

import cirron as ci
from support import run_script


def broken_run(tmp_path, mode, *extra):
    result = run_script(
        SCRIPTS / "own_failures.py", str(tmp_path / "trace"), mode, *extra, cwd=tmp_path, timeout=90
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT ")), result.stderr.splitlines()


@pytest.mark.slow
def test_an_exporter_that_raises_is_counted_and_told_once(tmp_path, figures):
    result, lines = broken_run(tmp_path, "exporter-raises")
    health = result["health"]
    assert len(lines) == 1 and "deliberately failing exporter" in lines[0], lines
    assert health["export_errors"] == health["sinks"]["spool"]["errors"] == 3
    assert "deliberately failing exporter" in health["last_export_error"]
    spool = health["sinks"]["spool"]
    assert spool["exported"] + spool["dropped"] == health["spans_ended"]
    assert assert_spool_intact(tmp_path / "trace") == spool["exported"] > 0  # then it worked
    figures["exporter raising 3 times: spans written / lost (counted)"] = (
        f"{spool['exported']} / {spool['dropped']}"
    )


@pytest.mark.slow
def test_an_exporter_that_ends_its_thread_gets_a_new_thread(tmp_path):
    result, lines = broken_run(tmp_path, "exporter-kills-its-thread")
    health = result["health"]
    # Told once that the thread died, once that the batch in its hands was lost.
    died, lost = sorted(lines, key=lambda line: "died" not in line)
    assert "cirron-sink-spool died" in died, lines
    assert "did not reach the spool sink: the exporter ended its thread" in lost, lines
    assert health["threads_restarted"] == 1
    spool = health["sinks"]["spool"]
    assert spool["errors"] == 1 and spool["dropped"] > 0  # the one batch in its hands
    assert spool["exported"] + spool["dropped"] == health["spans_ended"]
    assert health["spans_dropped"] == spool["dropped"]
    assert assert_spool_intact(tmp_path / "trace") == spool["exported"] > 0


@pytest.mark.slow
def test_a_killed_flush_thread_is_replaced_and_exports_by_itself(tmp_path):
    result, lines = broken_run(tmp_path, "flush-thread-killed")
    health = result["health"]
    assert result["killed_thread_ended"] is True
    assert len(lines) == 1 and "cirron-flush died" in lines[0], lines
    assert health["threads_restarted"] == 1
    # Files kept coming with nobody calling ci.flush(): the new thread flushes.
    assert result["files_after"] >= result["files_before"] + 3, result
    assert result["flush_threads"] == 1
    assert health["spans_dropped"] == 0
    assert health["sinks"]["spool"]["exported"] == health["spans_ended"]
    assert assert_spool_intact(tmp_path / "trace") == health["spans_ended"]


@pytest.mark.slow
def test_a_torch_hook_that_raises_changes_nothing_in_training(tmp_path):
    pytest.importorskip("torch")
    baseline, _ = broken_run(tmp_path, "hook-raises", "--no-cirron")
    result, lines = broken_run(tmp_path, "hook-raises")
    assert result["losses"] == baseline["losses"]  # bit for bit
    health = result["health"]
    assert health["hook_errors"] == 16  # every optimizer step of 2 epochs of 8 batches
    assert len(lines) == 1 and "deliberately broken hook" in lines[0], lines
    assert health["spans_dropped"] == health["export_errors"] == 0
    spans = ci.spool_spans(str(tmp_path / "trace"))
    assert sum(s["name"] == "forward" for s in spans) == 16  # the other hooks still record
