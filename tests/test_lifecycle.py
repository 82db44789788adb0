"""Process lifecycle: exit, restart and the off switch.

Each test reads like a user's script. The ones that need a whole process run
the small scripts in ``tests/scripts/`` as real subprocesses and read the real
spool files they leave. Signals and fork are in ``tests/reliability/``.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path

import pytest

import cirron as ci
from support import (
    assert_consistent,
    attribute,
    clean_environment,
    epoch_batches,
    named,
    run_script,
    spool_pids,
    the_session,
)

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(autouse=True)
def _shut_down_after_each_test():
    yield
    ci.shutdown()


# -- Normal exit without ci.shutdown() -------------------------------------------


@pytest.mark.slow
def test_exit_without_shutdown_flushes_and_closes_open_scopes(tmp_path):
    spool = tmp_path / "trace"
    result = run_script(SCRIPTS / "exit_without_shutdown.py", str(spool), cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("DONE")
    assert "Traceback" not in result.stderr
    pid = int(result.stdout.split()[1])
    assert spool_pids(spool) == {pid}

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)
    session = the_session(spans)
    by_epoch = epoch_batches(spans)
    assert {i: len(bs) for i, bs in by_epoch.items()} == {0: 3, 1: 3, 2: 0}
    (left_open,) = named(spans, "left-open")
    assert [e["name"] for e in left_open.get("events", [])] == ["last"]
    # Closed innermost first, the session last.
    (unfinished,) = [e for e in named(spans, "epoch") if attribute(e, "index") == 2]
    assert left_open["parentSpanId"] == unfinished["spanId"]
    assert int(left_open["endTimeUnixNano"]) <= int(unfinished["endTimeUnixNano"])
    assert all(int(s["endTimeUnixNano"]) <= int(session["endTimeUnixNano"]) for s in spans)
    assert len(spans) == 1 + 3 + 6 + 1


# -- Restart in the same process ------------------------------------------------------


def test_shutdown_then_profile_starts_fresh(tmp_path):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    first = ci.profile(path=str(tmp_path / "first"), flush_interval=30.0, frameworks=[])
    for _ in ci.epochs(range(2)):
        with ci.scope("work"):
            ci.mark("loss", 0.5)
    first_session = ci.trace(format="dict")["span_id"]
    assert ci.health()["spans_ended"] == 4
    ci.shutdown()
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert ci.health()["enabled"] is False

    second = ci.profile(path=str(tmp_path / "second"), flush_interval=30.0, frameworks=[])
    assert second is not first
    second_session = ci.trace(format="dict")["span_id"]
    assert second_session != first_session
    health = ci.health()
    assert health["enabled"] is True
    assert health["spans_ended"] == 0
    assert health["spans_exported"] == 0
    assert health["spans_started"] <= 1  # at most the new session
    assert all(sink["exported"] == 0 for sink in health["sinks"].values())
    for _ in ci.epochs(range(1)):
        pass
    epoch = ci.trace(format="dict", name="epoch")
    assert [node["index"] for node in epoch] == [0]  # epoch indexes start again at 0
    ci.shutdown()
    assert {s: signal.getsignal(s) for s in handlers} == handlers

    first_spans = ci.spool_spans(str(tmp_path / "first"))
    second_spans = ci.spool_spans(str(tmp_path / "second"))
    assert_consistent(first_spans + second_spans)
    assert the_session(first_spans)["spanId"] == first_session
    assert the_session(second_spans)["spanId"] == second_session
    assert the_session(first_spans)["traceId"] != the_session(second_spans)["traceId"]
    assert [e["parentSpanId"] for e in named(first_spans, "epoch")] == [first_session] * 2
    assert [e["parentSpanId"] for e in named(second_spans, "epoch")] == [second_session]


def test_profile_after_shutdown_keeps_the_first_sessions_spool_files(tmp_path):
    sessions = []
    for run in range(2):
        ci.profile(path=str(tmp_path), flush_interval=30.0, frameworks=[])
        with ci.scope("work", index=run):
            pass
        sessions.append(ci.trace(format="dict")["span_id"])
        ci.shutdown()
    spans = ci.spool_spans(str(tmp_path))
    assert_consistent(spans)
    assert sorted(s["spanId"] for s in named(spans, "cirron.session")) == sorted(sessions)
    assert sorted(attribute(s, "index") for s in named(spans, "work")) == [0, 1]


def test_second_profile_returns_the_same_handle_and_warns_once(tmp_path, caplog):
    first = ci.profile(path=str(tmp_path), flush_interval=30.0, frameworks=[])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cirron"):
        again = ci.profile(path=str(tmp_path / "elsewhere"), flush_interval=0.5)
    assert again is first
    warnings = [
        r for r in caplog.records if r.name.startswith("cirron") and r.levelno >= logging.WARNING
    ]
    assert len(warnings) == 1
    assert "already" in warnings[0].getMessage()
    # The running profiler kept its settings: nothing goes to the second path.
    with ci.scope("work"):
        pass
    ci.shutdown()
    assert not (tmp_path / "elsewhere").exists()
    assert named(ci.spool_spans(str(tmp_path)), "work")


# -- The off switch -------------------------------------------------------------------


def test_enabled_false_starts_nothing_writes_nothing_and_runs_user_code(tmp_path):
    path = tmp_path / "trace"
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = threading.active_count()
    handle = ci.profile(enabled=False, path=str(path), flush_interval=0.01)
    assert threading.active_count() == threads
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert ci.health()["enabled"] is False
    assert handle.health()["enabled"] is False

    ran = []
    for epoch in ci.epochs(range(2)):
        for batch in ci.batches(["a", "b"]):
            with ci.scope("work", index=len(ran)):
                ran.append((epoch, batch))
            ci.mark("loss", 0.1)

    @ci.scope("decorated")
    def double(value):
        return 2 * value

    assert double(21) == 42
    assert ran == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert ci.flush() is True
    time.sleep(0.05)
    assert threading.active_count() == threads
    ci.shutdown()
    assert not path.exists()
    assert threading.active_count() == threads


@pytest.mark.slow
def test_otel_sdk_disabled_starts_nothing_writes_nothing_and_runs_user_code(tmp_path):
    path = tmp_path / "trace"
    result = run_script(
        SCRIPTS / "sdk_disabled.py",
        str(path),
        cwd=tmp_path,
        timeout=30,
        env=clean_environment(OTEL_SDK_DISABLED="true"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["threads_after"] == report["threads_before"] == report["threads_end"]
    assert report["enabled"] is False
    assert report["handle_enabled"] is False
    assert report["ran"] == 6
    assert report["decorated"] == 42
    assert report["exists"] is False
    assert not path.exists()
    assert not (tmp_path / ".cirron").exists()
