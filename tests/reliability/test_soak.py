"""Promise 9: a long steady run with every sink on stays flat and loses nothing.

The steady training script runs for ``CIRRON_SOAK_SECONDS`` (60 s by default,
as CI runs it; the issue's full soak is ``CIRRON_SOAK_SECONDS=600``) with the
spool, stdout, log and OTLP (to rotel) sinks all on. After warm-up (a quarter
of the run, at least 15 s, and until twice the in-memory trace store's spans have
ended: the ring, the sink queues and the store have filled to their bounds by
then, however slow the machine) its RSS and thread count stay flat;
no span is dropped by any sink; every spool file is valid; each sink got
every span exactly once.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

import pytest
from faults import SCRIPTS, assert_spool_intact, parse_reports

from otlp_receiver import OtlpReceiver
from support import clean_environment

SECONDS = float(os.environ.get("CIRRON_SOAK_SECONDS", "60"))
RSS_GROWTH_MB = 8.0  # after warm-up: allocator noise is a few MB, a leak grows with time
# The in-memory trace store's bound (ci.trace()'s spans; 10,000 by default): small, so that it
# fills early in the run on a slow machine too (at 8 ms a batch, 10,000 took 36 s, past the
# warm-up, and its filling read as growth). A leak grows with the spans whatever the bound.
TRACE_BUFFER = 2000


@pytest.mark.slow
def test_a_long_run_with_every_sink_on_stays_flat_and_loses_nothing(tmp_path, figures):
    receiver = OtlpReceiver(str(tmp_path / "rotel"), verbosity="basic").start()
    try:
        stdout_path, log_path = tmp_path / "stdout.txt", tmp_path / "log.txt"
        with open(stdout_path, "w") as stdout:
            started = time.monotonic()
            result = subprocess.run(
                [
                    sys.executable, str(SCRIPTS / "steady_train.py"), str(tmp_path / "trace"),
                    "--seconds", str(SECONDS), "--output", "spool,stdout,log",
                    "--log-file", str(log_path), "--flush-interval", "1.0",
                    # ~1,100 spans/s: under the ~2,000 lines/s the log sink gets through a
                    # flushing FileHandler beside a loop that holds the interpreter
                    "--work", "40000", "--report-every", "1.0",
                ],
                cwd=tmp_path,
                env=clean_environment(
                    OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint,
                    CIRRON_TRACE_BUFFER=str(TRACE_BUFFER),
                ),
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                timeout=SECONDS + 120,
            )  # fmt: skip
            elapsed = time.monotonic() - started
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stderr.strip() == "" or result.stderr.startswith("main-done-at"), (
            result.stderr[-3000:]
        )
        reports = _reports(stdout_path)
        health = reports["HEALTH"][-1]
        ended = health["spans_ended"]
        received = _received(receiver, ended)
    finally:
        receiver.stop()

    # Nothing dropped, anywhere; every sink got every span once.
    assert health["spans_dropped"] == health["marks_dropped"] == 0, str(health["sinks"])
    assert health["export_errors"] == health["threads_restarted"] == 0
    for name, sink in health["sinks"].items():
        assert sink == {"exported": ended, "dropped": 0, "errors": 0}, (name, sink)
    assert assert_spool_intact(tmp_path / "trace") == ended
    # A line per span (and a line of metrics per epoch, not counted here).
    assert _count(stdout_path, "[cirron] ") - _count(stdout_path, "[cirron] metrics ") == ended
    assert _count(log_path, "[cirron] ") - _count(log_path, "[cirron] metrics ") == ended
    assert received == ended

    # Flat after warm-up.
    statuses = reports["STATUS"]
    filled = next((s["t"] for s in statuses if s["ended"] >= 2 * TRACE_BUFFER), statuses[-1]["t"])
    warm = max(statuses[0]["t"] + max(15.0, SECONDS / 4), filled)
    steady = [s for s in statuses if s["t"] >= warm]
    assert len(steady) >= 5, len(steady)
    rss = [s["rss_kb"] / 1024 for s in steady]
    head, tail = statistics.median(rss[:5]), statistics.median(rss[-5:])
    threads = {s["threads"] for s in steady}
    figures[f"soak {SECONDS:.0f} s, all sinks: spans, spans/s"] = (
        f"{ended}, {ended / reports['TRAINED'][-1]['train_seconds']:.0f}"
    )
    figures[f"soak {SECONDS:.0f} s: RSS after warm-up / at the end (MB), OS threads"] = (
        f"{head:.1f} / {tail:.1f} (max {max(rss):.1f}), {sorted(threads)}"
    )
    figures[f"soak {SECONDS:.0f} s: wall time of the test (s)"] = round(elapsed, 1)
    assert tail - head < RSS_GROWTH_MB, rss
    assert max(rss) - head < RSS_GROWTH_MB * 1.5, rss
    assert len(threads) == 1, threads


def _reports(path) -> dict:
    """The script's STATUS/TRAINED/HEALTH reports among the stdout sink's lines."""
    with open(path, encoding="utf-8") as stream:
        return parse_reports("".join(line for line in stream if not line.startswith("[cirron]")))


def _count(path, prefix: str) -> int:
    with open(path, encoding="utf-8") as stream:
        return sum(prefix in line for line in stream)


def _received(receiver: OtlpReceiver, expected: int, timeout: float = 20) -> int:
    """Spans rotel reported receiving ("Received traces ... spans=N"), once they add up."""
    deadline = time.monotonic() + timeout
    while True:
        total = sum(int(n) for n in re.findall(r"Received traces.* spans=(\d+)", receiver.text()))
        if total >= expected or time.monotonic() > deadline:
            return total
        time.sleep(0.1)
