"""Promise 2: after an outage, export to the OTLP backend resumes by itself.

A training script starts while nothing answers on its endpoint's port (or an
HTTP server answers 503 there). Once its OTLP sink has failed, the collector
(rotel) starts on that very port; the script is not told. The exporter's next
attempt gets through (within its retry back-off: a second or two), and every
span that ends from then on reaches the collector; what could not be sent is
counted as dropped, and the spool has had everything all along.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from faults import SCRIPTS, ErrorServer, assert_spool_intact, closed_port, parse_reports

import cirron as ci
from otlp_receiver import OtlpReceiver
from support import Script, clean_environment


def latest_status(script: Script) -> dict[str, Any] | None:
    statuses = parse_reports("".join(script.out)).get("STATUS")
    return statuses[-1] if statuses else None


def wait_for_status(script: Script, condition: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = latest_status(script)
        if status is not None and condition(status):
            return status
        assert script.process.poll() is None, "".join(script.err)[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no such status within {timeout}s; last: {latest_status(script)}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "protocol, outage",
    [("http/protobuf", "refused"), ("grpc", "refused"), ("http/protobuf", "503")],
    ids=["http-refused", "grpc-refused", "http-503"],
)
def test_export_resumes_by_itself_when_the_backend_comes_back(protocol, outage, tmp_path, figures):
    grpc_port, http_port = closed_port(), closed_port()
    port = grpc_port if protocol == "grpc" else http_port
    broken = ErrorServer(503, port=port) if outage == "503" else None
    stop = tmp_path / "stop"
    environment = clean_environment(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_TIMEOUT="2",  # each failed export gives up after 2 s
    )
    # About 400 spans a second: a pace the collector (printing every span) keeps up with.
    arguments = ["--stop-file", str(stop), "--work", "100000", "--report-every", "0.1"]
    receiver = OtlpReceiver(str(tmp_path / "rotel"))
    try:
        with Script(
            SCRIPTS / "steady_train.py", str(tmp_path / "trace"), *arguments,
            cwd=tmp_path, env=environment,
        ) as script:  # fmt: skip
            # The outage: the sink has failed at least once.
            wait_for_status(script, lambda s: s["sinks"]["otlp"]["errors"] >= 1)
            if broken is not None:
                broken.close()
            receiver.start(ports=(grpc_port, http_port))
            back_at = time.monotonic()
            # Nothing is done to the running script: its next export attempt (at the
            # latest when the exporter's retry back-off ends) gets through, and from then
            # on everything does.
            returned = wait_for_status(script, lambda s: s["sinks"]["otlp"]["exported"] > 0)
            resumed_after = time.monotonic() - back_at
            wait_for_status(script, lambda s: s["epoch"] >= returned["epoch"] + 10)
            stop.touch()
            returncode, out, err = script.finish(timeout=30)
    finally:
        if broken is not None:
            broken.close()
    try:
        assert returncode == 0, err[-3000:]
        pid = json.loads(out.split("TRAINED ", 1)[1].splitlines()[0])["pid"]
        health = parse_reports(out)["HEALTH"][-1]
        spooled = ci.spool_spans(str(tmp_path / "trace"))
        assert assert_spool_intact(tmp_path / "trace") == len(spooled) == health["spans_ended"]
        # Every span that ended after export resumed reaches the backend: the epochs
        # after the one it resumed in, with all their batches and work, and the session.
        after = {returned["epoch"] + 2 + n for n in range(5)}
        epochs = {s["spanId"] for s in spooled if s["name"] == "epoch" and _index(s) in after}
        assert len(epochs) == 5
        session = {s["spanId"] for s in spooled if s["name"] == "cirron.session"}
        expected = epochs | _descendants(spooled, epochs) | session
        receiver.wait_for_spans(
            lambda spans: expected <= {s["span_id"] for s in spans if _pid(s) == pid},
            timeout=20,
        )
        otlp = health["sinks"]["otlp"]
        assert otlp["errors"] >= 1 and otlp["exported"] >= len(expected), otlp
        # Nothing unaccounted: each span was exported or counted as dropped, once.
        assert otlp["exported"] + otlp["dropped"] == health["spans_ended"], otlp
        figures[
            f"backend back ({protocol}, {outage}): resumed after (s), spans exported / dropped"
        ] = f"{resumed_after:.1f}, {otlp['exported']} / {otlp['dropped']}"
    finally:
        receiver.stop()


def _pid(span: dict[str, Any]) -> Any:
    return span["resource"].get("process.pid")


def _index(span: dict[str, Any]) -> int | None:
    for item in span.get("attributes", []):
        if item["key"] == "index":
            return int(item["value"]["intValue"])
    return None


def _descendants(spans: list[dict[str, Any]], roots: set[str]) -> set[str]:
    found, frontier = set(), set(roots)
    while frontier:
        frontier = {s["spanId"] for s in spans if s.get("parentSpanId") in frontier} - found - roots
        found |= frontier
    return found
