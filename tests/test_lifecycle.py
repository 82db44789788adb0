"""Process lifecycle: exit, signals, fork, restart and the off switch.

Each test reads like a user's script. The ones that need a whole process
(signals, exit, fork) run the small scripts in ``tests/scripts/`` as real
subprocesses, send real signals and read the real spool files they leave.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import cirron as ci

SCRIPTS = Path(__file__).parent / "scripts"


# -- helpers ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _shut_down_after_each_test():
    yield
    ci.shutdown()


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without OTEL_*/CIRRON_* (no stray endpoint or path)."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "CIRRON_", "TRACEPARENT", "TRACESTATE"))
    }
    environment.update(extra)
    return environment


class Script:
    """A script from tests/scripts/ running as a subprocess; always killed on exit."""

    def __init__(self, name: str, *args: str, cwd: Path, env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPTS / name), *args],
            cwd=cwd,
            env=env if env is not None else clean_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(
                target=self._read, args=(self.process.stdout, self.out, True), daemon=True
            ),
            threading.Thread(
                target=self._read, args=(self.process.stderr, self.err, False), daemon=True
            ),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, into: list[str], announce: bool) -> None:
        for line in stream:
            into.append(line)
            if announce:
                self.lines.put(line)

    def __enter__(self) -> Script:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"no {text!r} from the script within {timeout}s; "
                    f"stdout={''.join(self.out)!r} stderr={''.join(self.err)[-2000:]!r}"
                )
            try:
                line = self.lines.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    for reader in self._readers:
                        reader.join(timeout=5)
                    if any(text in seen for seen in self.out):
                        return
                    raise AssertionError(
                        f"script exited ({self.process.returncode}) before {text!r}; "
                        f"stdout={''.join(self.out)!r} stderr={''.join(self.err)[-2000:]!r}"
                    ) from None
                continue
            if text in line:
                return

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = 20.0) -> tuple[int, str, str]:
        """Wait for the exit; returns (returncode, stdout, stderr)."""
        self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        return self.process.returncode, "".join(self.out), "".join(self.err)


def run_script(
    name: str, *args: str, cwd: Path, timeout: float = 30.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=cwd,
        env=env if env is not None else clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spool_pids(path: Path) -> set[int]:
    return {int(name.name.partition("-")[0]) for name in (path / "spool").glob("*-*.json")}


def attribute(span: dict[str, Any], key: str) -> Any:
    for item in span.get("attributes", []):
        if item["key"] == key:
            ((kind, value),) = item["value"].items()
            return int(value) if kind == "intValue" else value
    return None


def status(span: dict[str, Any]) -> dict[str, Any]:
    return span.get("status", {})


def is_error(span: dict[str, Any]) -> bool:
    return status(span).get("code") == 2


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


def children(spans: list[dict[str, Any]], parent: dict[str, Any], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name and s.get("parentSpanId") == parent["spanId"]]


def assert_consistent(spans: list[dict[str, Any]]) -> None:
    """One tree: unique span ids, every parent present, every span ended."""
    ids = collections.Counter(span["spanId"] for span in spans)
    assert [i for i, n in ids.items() if n > 1] == [], "a span was exported twice"
    for span in spans:
        parent = span.get("parentSpanId")
        assert parent is None or parent in ids, f"{span['name']}: parent {parent} missing"
        assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0


def the_session(spans: list[dict[str, Any]]) -> dict[str, Any]:
    sessions = named(spans, "cirron.session")
    assert len(sessions) == 1, f"{len(sessions)} cirron.session spans"
    return sessions[0]


def epoch_batches(spans: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Batch spans by epoch index, each list ordered by batch index."""
    result = {}
    for epoch in named(spans, "epoch"):
        batches = children(spans, epoch, "batch")
        result[attribute(epoch, "index")] = sorted(batches, key=lambda s: attribute(s, "index"))
    return result


# -- 1. SIGTERM, no handler of the script's own ---------------------------------


@pytest.mark.slow
def test_sigterm_mid_loop_flushes_everything_and_dies_by_sigterm(tmp_path):
    spool = tmp_path / "trace"
    with Script("train_signal.py", str(spool), cwd=tmp_path) as script:
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
    with Script("train_signal.py", str(tmp_path / "unused"), "--no-cirron", cwd=tmp_path) as script:
        script.wait_for("READY")
        script.send(signal.SIGTERM)
        returncode, out, _ = script.finish(timeout=20)
    assert returncode == -signal.SIGTERM
    assert "DONE" not in out


# -- 2. SIGTERM, with the script's own graceful-stop handler ---------------------


@pytest.mark.slow
def test_sigterm_runs_the_scripts_own_handler_then_exits_normally(tmp_path):
    spool = tmp_path / "trace"
    with Script("train_signal.py", str(spool), "--user-handler", cwd=tmp_path) as script:
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


# -- 3. SIGINT (Ctrl-C) ------------------------------------------------------------


@pytest.fixture(scope="module")
def ctrl_c(tmp_path_factory):
    """The same script interrupted by SIGINT, with and without cirron."""
    runs = {}
    for variant in ("cirron", "baseline"):
        directory = tmp_path_factory.mktemp(f"sigint-{variant}")
        extra = ["--catch-ki"] + (["--no-cirron"] if variant == "baseline" else [])
        with Script("train_signal.py", str(directory / "trace"), *extra, cwd=directory) as script:
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


# -- 4. Normal exit without ci.shutdown() -------------------------------------------


@pytest.mark.slow
def test_exit_without_shutdown_flushes_and_closes_open_scopes(tmp_path):
    spool = tmp_path / "trace"
    result = run_script("exit_without_shutdown.py", str(spool), cwd=tmp_path, timeout=30)
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


# -- 5. fork -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["os_exit", "sys_exit", "profile_again"])
def test_forked_child_neither_hangs_nor_exports_the_parents_spans(tmp_path, mode):
    spool = tmp_path / "trace"
    result = run_script("fork_child.py", str(spool), mode, cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("DONE")
    assert "Traceback" not in result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    parent = int(lines["PID"])
    child, child_status = map(int, lines["CHILD"].split())
    assert child_status == 0

    pids = spool_pids(spool)
    assert parent in pids
    assert pids - {parent} == ({child} if mode == "profile_again" else set())

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)  # no span id twice across all spool files
    parent_spans = []
    for name in sorted((spool / "spool").glob(f"{parent}-*.json")):
        request = json.loads(name.read_text())
        for resource_spans in request["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                parent_spans += scope_spans["spans"]
    counts = collections.Counter(span["name"] for span in parent_spans)
    assert counts == {"before-flush": 1, "parent-work": 4, "batch": 4, "cirron.session": 1}
    assert [attribute(b, "index") for b in named(parent_spans, "batch")] == [0, 1, 2, 3]
    assert not any(is_error(span) for span in parent_spans)

    if mode == "profile_again":
        # ci.profile() in the child starts a fresh session of its own.
        child_spans = [s for s in spans if s["spanId"] not in {p["spanId"] for p in parent_spans}]
        assert collections.Counter(s["name"] for s in child_spans) == {
            "cirron.session": 1,
            "child-session-work": 1,
        }
        assert the_session(child_spans)["traceId"] != the_session(parent_spans)["traceId"]


@pytest.mark.slow
def test_dataloader_with_forked_workers_under_ci_batches(tmp_path):
    pytest.importorskip("torch")
    spool = tmp_path / "trace"
    result = run_script("dataloader_fork.py", str(spool), cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "SEEN 64" in result.stdout
    assert result.stdout.rstrip().endswith("DONE")
    pid = int(result.stdout.split()[1])
    assert spool_pids(spool) == {pid}, "a DataLoader worker wrote spool files"

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)
    the_session(spans)
    by_epoch = epoch_batches(spans)
    assert sorted(by_epoch) == [0, 1]
    for batches in by_epoch.values():
        assert [attribute(b, "index") for b in batches] == list(range(8))
        for batch in batches:
            assert attribute(batch, "data_load_ns") >= 0
            assert [e["name"] for e in batch.get("events", [])].count("loss") == 1
    assert not any(is_error(span) for span in spans)


# -- 6. Restart in the same process ------------------------------------------------------


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


# -- 7. The off switch -------------------------------------------------------------------


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
        "sdk_disabled.py",
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


# -- A signal can land anywhere ----------------------------------------------------------


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """SIGTERM at each call of a mark + batch boundary; see tests/scripts/signal_sweep.py."""
    directory = tmp_path_factory.mktemp("sweep")
    result = run_script("signal_sweep.py", str(directory), cwd=directory, timeout=90)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dry_status"] == 0
    assert report["calls"] > 10  # the armed region really ran through cirron
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
