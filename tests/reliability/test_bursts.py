"""Promise 10: a burst larger than a sink absorbs is told where you look, and is not lost for good.

A loop of back-to-back scopes makes hundreds of thousands of spans a second;
the OTLP exporter sends tens of thousands. The spool is waited for and takes
any burst; the OTLP sink, which never holds training up, loses what its queue
can't hold. Then ``ci.health()`` says so at the top (``spans_dropped``, and
``spans_exported`` counts only what every sink delivered), one warning says
so once, and again at the end of the run with the command that sends the rest:
what the collector acknowledged is noted beside the spool, so ``cirron export``
sends exactly the spans it missed. The collector here is a real one (``rotel``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faults import SCRIPTS, assert_spool_intact

import cirron as ci
from cirron.exporters import undelivered_spans
from otlp_receiver import OtlpReceiver
from support import clean_environment

PROTOCOLS = ("http/protobuf", "grpc")


@pytest.fixture(scope="module")
def receiver():
    receiver = OtlpReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


def burst(directory: Path, count: int, **environment: str) -> tuple[dict[str, Any], list[str]]:
    """Run ``scripts/burst.py``: its final health, and the warnings it logged."""
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "burst.py"), str(directory / "trace"), str(count)],
        cwd=directory,
        env=clean_environment(**environment),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("HEALTH ")]
    return json.loads(line.removeprefix("HEALTH ")), result.stderr.splitlines()


def otlp_environment(receiver: OtlpReceiver, protocol: str) -> dict[str, str]:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_collector_gets_exactly_what_the_spool_has_less_the_listed_undelivered(
    receiver, tmp_path, protocol, figures
):
    # A small buffer (a ring of 512, a sink queue of 256) so a short burst overflows it.
    health, warnings = burst(
        tmp_path, 6000, CIRRON_BUFFER_SIZE="512", **otlp_environment(receiver, protocol)
    )
    otlp, spool = health["sinks"]["otlp"], health["sinks"]["spool"]
    # The spool was waited for and has every span; the otlp sink lost some, and says so.
    assert spool == {"exported": 6001, "dropped": 0, "errors": 0}
    assert health["spans_ended"] == 6001 and otlp["dropped"] > 0
    assert health["spans_dropped"] == otlp["dropped"]
    assert health["spans_exported"] == otlp["exported"] == 6001 - otlp["dropped"]
    warning, ending = [line for line in warnings if line.startswith("cirron:")]  # no other
    endpoint = otlp_environment(receiver, protocol)["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert "did not reach the otlp sink: it can't keep up" in warning
    assert f"cirron export {tmp_path / 'trace'} --endpoint {endpoint}" in warning
    assert ending.startswith(f"cirron: {otlp['dropped']} span(s) not delivered to the otlp sink")

    spooled = {(s["traceId"], s["spanId"]) for s in ci.spool_spans(str(tmp_path / "trace"))}
    assert assert_spool_intact(tmp_path / "trace") == len(spooled) == 6001
    missed = undelivered_spans(str(tmp_path / "trace"), endpoint)
    assert len(missed) == otlp["dropped"] and missed <= spooled
    (trace_id,) = {trace_id for trace_id, _ in spooled}
    received = receiver.wait_for_spans(
        lambda spans: sum(s["trace_id"] == trace_id for s in spans) >= otlp["exported"],
        timeout=30,
    )
    delivered = {(s["trace_id"], s["span_id"]) for s in received if s["trace_id"] == trace_id}
    assert delivered == spooled - missed  # a replay of the listed ones completes the trace
    figures[f"burst of 6000 scopes, buffer_size 512, otlp {protocol}: delivered / listed"] = (
        f"{len(delivered)} / {len(missed)}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_with_the_default_buffers_a_burst_of_8000_spans_loses_nothing(
    receiver, tmp_path, protocol, figures
):
    health, warnings = burst(tmp_path, 8000, **otlp_environment(receiver, protocol))
    assert health["spans_dropped"] == 0 and health["spans_exported"] == 8001, health
    assert [line for line in warnings if line.startswith("cirron:")] == []
    endpoint = otlp_environment(receiver, protocol)["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert undelivered_spans(str(tmp_path / "trace"), endpoint) == set()
    figures[f"burst of 8000 scopes in {health['seconds']:.2f} s, otlp {protocol}: lost"] = 0


@pytest.mark.slow
def test_the_spool_alone_takes_a_burst_of_200000_spans(tmp_path, figures):
    health, warnings = burst(tmp_path, 200_000)
    assert health["spans_dropped"] == 0 and health["spans_exported"] == 200_001, health
    assert [line for line in warnings if line.startswith("cirron:")] == []
    figures["burst of 200000 scopes, spool only: seconds, lost"] = f"{health['seconds']:.2f}, 0"


@pytest.mark.slow
def test_a_burst_of_200000_to_otlp_reaches_the_collector_whole_after_one_export(tmp_path, figures):
    # The live sink loses most of such a burst; the spool has it all, and the export sends
    # what the collector lacks: every span arrives, at most a batch of them twice.
    with OtlpReceiver(verbosity="detailed") as collector:
        health, warnings = burst(
            tmp_path, 200_000, OTEL_EXPORTER_OTLP_ENDPOINT=collector.http_endpoint
        )
        otlp = health["sinks"]["otlp"]
        assert otlp["dropped"] > 0 and health["sinks"]["spool"]["dropped"] == 0
        (command,) = [
            line.split("run `", 1)[1].split("`", 1)[0]
            for line in warnings
            if "not delivered to the otlp sink" in line
        ]
        exported = subprocess.run(
            [str(Path(sys.executable).parent / "cirron"), *shlex.split(command)[1:]],
            cwd=tmp_path,
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert exported.returncode == 0, exported.stderr
        spooled = {s["spanId"] for s in ci.spool_spans(str(tmp_path / "trace"))}
        assert len(spooled) == 200_001
        collector.wait_for(
            lambda _text: spooled <= set(collector.span_id_counts()), timeout=300, interval=1
        )
        counts = collector.span_id_counts()
    assert set(counts) == spooled
    assert sum(counts.values()) - len(spooled) <= 512  # at most one batch twice
    figures["burst of 200000 scopes to otlp: live sink dropped, export sent"] = (
        f"{otlp['dropped']}, {exported.stderr.split(' spans sent')[0].split()[-1]}"
    )
