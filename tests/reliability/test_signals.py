"""Promise 3: SIGTERM, SIGINT and SIGKILL lose nothing beyond the documented window.

The scripts in ``scripts/`` run as real subprocesses and get real signals in
the middle of an epoch. SIGTERM/SIGINT: every span that ended and every scope
still open (closed with status ERROR naming the signal) is in the spool, the
program's own handler still runs, and the exit status is the one it would
have been without cirron. SIGKILL can't be caught: at most the spans of the
last ``flush_interval`` are lost, and no spool file is ever half written.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from faults import assert_spool_intact, parse_reports

import cirron as ci
from support import (
    Script,
    assert_consistent,
    attribute,
    children,
    clean_environment,
    epoch_batches,
    is_error,
    named,
    run_script,
    spool_pids,
    status,
    the_session,
)

SCRIPTS = Path(__file__).parent / "scripts"


# -- SIGTERM, no handler of the script's own ---------------------------------


@pytest.mark.slow
def test_sigterm_mid_loop_flushes_everything_and_dies_by_sigterm(tmp_path):
    spool = tmp_path / "trace"
    with Script(SCRIPTS / "train_signal.py", str(spool), cwd=tmp_path) as script:
        script.wait_for("READY")
        script.send(signal.SIGTERM)
        returncode, out, err = script.finish(timeout=20)

    # Killed by the signal, exactly as the same script without cirron.
    assert returncode == -signal.SIGTERM, err
    assert "DONE" not in out
    assert "Traceback" not in err
    assert spool_pids(spool) == {script.pid}

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)
    by_epoch = epoch_batches(spans)
    assert sorted(by_epoch) == [0, 1]
    assert [attribute(b, "index") for b in by_epoch[0]] == [0, 1, 2, 3]
    assert [attribute(b, "index") for b in by_epoch[1]] == [0, 1, 2]

    # Everything that ended before the signal is there, untouched, with its marks
    # (flush_interval=30: only the signal path can have written them).
    ended_before = [*by_epoch[0], *by_epoch[1][:2]]
    ended_before += [w for b in ended_before for w in children(spans, b, "work")]
    ended_before += [e for e in named(spans, "epoch") if attribute(e, "index") == 0]
    assert len(ended_before) == 4 + 2 + 6 + 1
    for span in ended_before:
        assert not is_error(span), span
    for work in named(spans, "work"):
        assert [e["name"] for e in work.get("events", [])].count("loss") == 1

    # The scopes open at the signal are closed with status ERROR naming it.
    interrupted_batch = by_epoch[1][2]
    interrupted = [
        *children(spans, interrupted_batch, "work"),
        interrupted_batch,
        *[e for e in named(spans, "epoch") if attribute(e, "index") == 1],
        the_session(spans),
    ]
    assert [s["name"] for s in interrupted] == ["work", "batch", "epoch", "cirron.session"]
    for span in interrupted:
        assert status(span)["code"] == 2, span
        assert "SIGTERM" in status(span).get("message", ""), span
    assert len(spans) == len(ended_before) + len(interrupted)


@pytest.mark.slow
def test_sigterm_exit_status_is_the_same_without_cirron(tmp_path):
    with Script(
        SCRIPTS / "train_signal.py", str(tmp_path / "unused"), "--no-cirron", cwd=tmp_path
    ) as script:
        script.wait_for("READY")
        script.send(signal.SIGTERM)
        returncode, out, _ = script.finish(timeout=20)
    assert returncode == -signal.SIGTERM
    assert "DONE" not in out


# -- SIGTERM, with the script's own graceful-stop handler ---------------------


@pytest.mark.slow
def test_sigterm_runs_the_scripts_own_handler_then_exits_normally(tmp_path):
    spool = tmp_path / "trace"
    with Script(SCRIPTS / "train_signal.py", str(spool), "--user-handler", cwd=tmp_path) as script:
        script.wait_for("READY")
        script.send(signal.SIGTERM)
        returncode, out, err = script.finish(timeout=20)

    assert "USER-HANDLER SIGTERM" in out
    assert out.rstrip().endswith("DONE")
    assert returncode == 0, err
    assert "Traceback" not in err

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)
    by_epoch = epoch_batches(spans)
    assert {i: [attribute(b, "index") for b in bs] for i, bs in by_epoch.items()} == {
        0: [0, 1, 2, 3],
        1: [0, 1, 2],
    }
    assert len(named(spans, "work")) == 7
    session = the_session(spans)
    assert all(span.get("parentSpanId") for span in spans if span is not session)
    # A graceful stop is not a failure: nothing was cut off.
    assert [s["name"] for s in spans if is_error(s)] == []
    assert len(spans) == 2 + 7 + 7 + 1


# -- SIGINT (Ctrl-C) ------------------------------------------------------------


@pytest.fixture(scope="module")
def ctrl_c(tmp_path_factory):
    """The same script interrupted by SIGINT, with and without cirron."""
    runs = {}
    for variant in ("cirron", "baseline"):
        directory = tmp_path_factory.mktemp(f"sigint-{variant}")
        extra = ["--catch-ki"] + (["--no-cirron"] if variant == "baseline" else [])
        with Script(
            SCRIPTS / "train_signal.py", str(directory / "trace"), *extra, cwd=directory
        ) as script:
            script.wait_for("READY")
            script.send(signal.SIGINT)
            returncode, out, err = script.finish(timeout=20)
        runs[variant] = {
            "returncode": returncode,
            "out": out,
            "err": err,
            "spans": ci.spool_spans(str(directory / "trace")),
        }
    return runs


def _names_sigint(span: dict[str, Any]) -> bool:
    message = status(span).get("message", "")
    return "KeyboardInterrupt" in message or "SIGINT" in message


@pytest.mark.slow
def test_sigint_raises_keyboard_interrupt_as_without_cirron(ctrl_c):
    with_cirron, baseline = ctrl_c["cirron"], ctrl_c["baseline"]
    # The script's `except KeyboardInterrupt` ran, and the process ended the same way.
    assert with_cirron["out"].splitlines()[-1] == "KI"
    assert baseline["out"].splitlines()[-1] == "KI"
    assert with_cirron["returncode"] == baseline["returncode"] == -signal.SIGINT
    assert with_cirron["err"].rstrip().splitlines()[-1] == "KeyboardInterrupt"
    assert baseline["err"].rstrip().splitlines()[-1] == "KeyboardInterrupt"


@pytest.mark.slow
def test_sigint_records_keyboard_interrupt_on_the_open_with_scope(ctrl_c):
    spans = ctrl_c["cirron"]["spans"]
    assert_consistent(spans)
    by_epoch = epoch_batches(spans)
    assert [attribute(b, "index") for b in by_epoch[1]] == [0, 1, 2]
    (work,) = children(spans, by_epoch[1][2], "work")
    assert is_error(work) and _names_sigint(work), work
    exceptions = [e for e in work.get("events", []) if e["name"] == "exception"]
    assert [attribute(e, "exception.type") for e in exceptions] == ["KeyboardInterrupt"]
    # Spans that ended before Ctrl-C are untouched.
    for batch in [*by_epoch[0], *by_epoch[1][:2]]:
        assert not is_error(batch)
    assert len(named(spans, "work")) == 7


@pytest.mark.slow
def test_sigint_closes_the_interrupted_loop_scopes_and_session_with_error(ctrl_c):
    spans = ctrl_c["cirron"]["spans"]
    by_epoch = epoch_batches(spans)
    interrupted = [
        by_epoch[1][2],
        *[e for e in named(spans, "epoch") if attribute(e, "index") == 1],
        the_session(spans),
    ]
    assert [s["name"] for s in interrupted] == ["batch", "epoch", "cirron.session"]
    for span in interrupted:
        assert is_error(span) and _names_sigint(span), span


@pytest.mark.slow
def test_an_uncaught_ctrl_c_still_ends_the_run_as_sigint_with_the_summary_printed(tmp_path):
    # The summary is made at exit: a module first imported then must not exec() a string (a
    # named tuple, a dataclass), which makes CPython forget the uncaught KeyboardInterrupt.
    env = clean_environment()
    env["CIRRON_RUN_SUMMARY"] = "1"
    with Script(
        SCRIPTS / "train_signal.py", str(tmp_path / "trace"), cwd=tmp_path, env=env
    ) as script:
        script.wait_for("READY")
        script.send(signal.SIGINT)
        returncode, _out, err = script.finish(timeout=20)
    assert "[cirron] run summary: " in err
    assert returncode == -signal.SIGINT, err


# -- A signal can land anywhere ----------------------------------------------------------


@pytest.fixture(scope="module", params=["compiled", "pure"])
def sweep(request, tmp_path_factory):
    """SIGTERM at each call of a mark + batch boundary; see tests/scripts/signal_sweep.py.

    On both twins: the compiled ones make fewer calls a signal can land between (a call of
    theirs runs no Python), the pure ones have cirron's bookkeeping in Python frames."""
    directory = tmp_path_factory.mktemp("sweep")
    environment = clean_environment()
    if request.param == "pure":
        environment["CIRRON_PURE_PYTHON"] = "1"
    result = run_script(
        SCRIPTS / "signal_sweep.py", str(directory), cwd=directory, timeout=90, env=environment
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dry_status"] == 0
    # The armed region really ran through cirron (a mark, a scope's end, a batch's end and the
    # next one's start): on the pure twins through a dozen calls a signal can land between;
    # the compiled ones make no Python call there (a signal is handled only in the loop's own
    # code around them), so their sweep is the region's edge.
    assert report["calls"] > 10 if request.param == "pure" else report["calls"] >= 1
    return report


@pytest.mark.slow
def test_sigterm_anywhere_in_the_hot_path_still_dies_by_sigterm_promptly(sweep):
    for result in sweep["results"]:
        assert result["status"] == -signal.SIGTERM, result
        assert result["seconds"] < 5, result  # bounded by exit_timeout, never hangs


@pytest.mark.slow
def test_sigterm_anywhere_in_the_hot_path_loses_no_span(sweep):
    failures = {r["k"]: r["problems"] for r in sweep["results"] if r["problems"]}
    assert failures == {}


# -- SIGKILL: at most the last flush interval -----------------------------------------


@pytest.mark.slow
def test_sigkill_loses_at_most_the_spans_of_the_last_flush_interval(tmp_path, figures):
    interval = 0.5
    path = tmp_path / "trace"
    arguments = ["--seconds", "60", "--flush-interval", str(interval), "--report-every", "0.02"]
    with Script(SCRIPTS / "steady_train.py", str(path), *arguments, cwd=tmp_path) as script:
        deadline = time.monotonic() + 30
        while len(list((path / "spool").glob("*.json.gz"))) < 6:  # six flushes, then the kill
            assert time.monotonic() < deadline and script.process.poll() is None, script.err
            time.sleep(0.01)
        killed_at = time.monotonic()
        script.send(signal.SIGKILL)
        returncode, out, _ = script.finish(timeout=10)
    assert returncode == -signal.SIGKILL

    # What the script had recorded, over time (it reported every 20 ms).
    statuses = parse_reports(out)["STATUS"]
    ended_by_kill = max(s["ended"] for s in statuses)
    # Everything that ended one flush interval (plus the flush's own work) before
    # the kill had to be on disk.
    settled = [s["ended"] for s in statuses if s["t"] <= killed_at - interval - 0.25]
    spooled = assert_spool_intact(path, temporary_allowed=True)
    spans = ci.spool_spans(str(path))
    assert len({s["spanId"] for s in spans}) == len(spans) == spooled
    assert spooled >= max(settled), (spooled, max(settled))
    lost = ended_by_kill - spooled
    per_interval = ended_by_kill / (statuses[-1]["t"] - statuses[0]["t"]) * interval
    figures["SIGKILL after 6 flushes: spans recorded / spooled / lost"] = (
        f"{ended_by_kill} / {spooled} / {lost} (one flush interval holds ~{per_interval:.0f})"
    )


# -- Whose thread takes a signal ----------------------------------------------------------


def _blocked_signals(native_id: int) -> set[int]:
    status_lines = Path(f"/proc/self/task/{native_id}/status").read_text().splitlines()
    (mask,) = [line.split()[1] for line in status_lines if line.startswith("SigBlk:")]
    bits = int(mask, 16)
    return {number for number in range(1, 65) if bits >> (number - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_cirron_threads_leave_the_programs_signals_to_its_main_thread(tmp_path):
    # A SIGINT the kernel hands to a sink thread would set Python's flag but not wake a main
    # thread asleep in time.sleep(): Ctrl-C would wait for the sleep to end.
    ci.profile(path=str(tmp_path / "trace"), frameworks=[])
    for _epoch in ci.epochs(range(2)):
        for _batch in ci.batches(range(3)):
            with ci.scope("work"):
                ci.mark("loss", 0.5)
    ci.flush()

    # Its own threads, and the SDK's metric reader it started.
    ours = [
        t
        for t in threading.enumerate()
        if t.name.startswith("cirron") or t.name == "OtelPeriodicExportingMetricReader"
    ]
    names = {t.name for t in ours}
    assert names >= {"cirron-flush", "cirron-sink-spool", "OtelPeriodicExportingMetricReader"}
    for thread in ours:
        blocked = _blocked_signals(thread.native_id)
        assert {signal.SIGINT, signal.SIGTERM, signal.SIGALRM} <= blocked, thread.name
        assert signal.SIGSEGV not in blocked, thread.name
    assert signal.SIGINT not in _blocked_signals(threading.main_thread().native_id)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_a_process_forked_from_a_cirron_thread_can_still_be_signalled():
    from cirron.otel.threads import daemon_thread

    read_end, write_end = os.pipe()
    children: list[int] = []

    def fork_and_report() -> None:  # e.g. an exporter of the user's that forks a helper
        pid = os.fork()
        if pid == 0:
            blocked = _blocked_signals(threading.get_native_id())
            os.write(write_end, b"1" if signal.SIGTERM in blocked else b"0")
            os._exit(0)
        children.append(pid)

    thread = daemon_thread(fork_and_report, "cirron-test-fork")
    thread.start()
    thread.join(10)
    assert os.read(read_end, 1) == b"0"
    os.waitpid(children[0], 0)
    os.close(read_end)
    os.close(write_end)
