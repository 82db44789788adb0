"""Promise 5: a spool that can't be written never stops training, and never leaves half a file.

``scripts/disk_trouble.py`` trains two epochs while its spool directory is a
file, read-only, on a "full disk" (a file size limit: writes fail part-way,
as with ENOSPC) or capped by ``CIRRON_SPOOL_MAX_BYTES``. Training always
completes; the condition is reported by one warning and in ``ci.health()``;
every file a reader can see is whole, valid OTLP/JSON, and no temporary file
is left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from faults import SCRIPTS, assert_spool_intact, parse_reports

import cirron as ci
from support import clean_environment, run_script

BATCHES = 100


def trouble(tmp_path: Path, mode: str, **environment: str) -> tuple[dict, list[str], Path]:
    """Run the script; returns (health after shutdown, warning lines, spool path).

    The spool is written plain (``spool_compression="none"``): the limits below are sized to
    its files (test_spool_compression checks the cap on compressed ones)."""
    path = tmp_path / "trace"
    environment.setdefault("CIRRON_SPOOL_COMPRESSION", "none")
    result = run_script(
        SCRIPTS / "disk_trouble.py", str(path), mode,
        cwd=tmp_path, timeout=60, env=clean_environment(**environment),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    reports = parse_reports(result.stdout)
    assert reports["TRAINED"][0]["batches"] == BATCHES  # training went on, to the end
    return reports["HEALTH"][0], result.stderr.splitlines(), path


def assert_reported_once(lines: list[str], words: str) -> None:
    """One warning about the spool says why; the metrics files, written beside the spool,
    meet the same disk: at most one warning of their own."""
    spool = [line for line in lines if "did not reach the spool sink" in line]
    metrics = [line for line in lines if "metrics" in line and line not in spool]
    assert len(spool) == 1 and len(spool) + len(metrics) == len(lines) and len(metrics) <= 1, lines
    assert spool[0].startswith("cirron: ") and words in spool[0], lines


def assert_accounted(health: dict) -> None:
    """Every ended span was written to the spool or counted as dropped for it, once.

    The spool is the only sink: what it lost is what the top-level figures count.
    """
    spool = health["sinks"]["spool"]
    assert spool["exported"] + spool["dropped"] == health["spans_ended"], health
    assert health["spans_dropped"] == spool["dropped"]
    assert health["spans_exported"] == spool["exported"]


@pytest.mark.slow
def test_a_full_disk_is_reported_once_and_writing_resumes_when_space_is_back(tmp_path, figures):
    health, lines, path = trouble(tmp_path, "file-size-limit")
    assert_reported_once(lines, "File too large")
    assert_accounted(health)
    spool = health["sinks"]["spool"]
    assert spool["dropped"] > 0 and spool["errors"] == health["errors_by_site"]["exporter spool"]
    # Whole files only, no temporary file left from the writes that failed part-way.
    assert assert_spool_intact(path) == spool["exported"]
    # Space came back after epoch 0: everything of epoch 1 is on disk.
    spans = ci.spool_spans(str(path))
    (epoch_1,) = [s for s in spans if s["name"] == "epoch" and _index(s) == 1]
    batches = [s for s in spans if s.get("parentSpanId") == epoch_1["spanId"]]
    assert sorted(_index(b) for b in batches) == list(range(50))
    figures["disk full during epoch 0: spans written / dropped (counted)"] = (
        f"{spool['exported']} / {spool['dropped']}"
    )


@pytest.mark.slow
def test_the_spool_size_cap_stops_the_spool_and_says_so(tmp_path, figures):
    cap = 20_000
    health, lines, path = trouble(tmp_path, "cap", CIRRON_SPOOL_MAX_BYTES=str(cap))
    assert_reported_once(lines, "spool_max_bytes")
    assert_accounted(health)
    assert health["spool_full"] is True
    written = sum(os.path.getsize(f) for f in ci.exporters.spool_files(str(path)))
    assert written == health["spool_bytes"] <= cap
    assert health["sinks"]["spool"]["dropped"] > 0
    assert "spool_max_bytes" in health["last_export_error"]
    assert assert_spool_intact(path) == health["sinks"]["spool"]["exported"]
    figures["spool cap 20000 bytes: bytes written, spans written / dropped (counted)"] = (
        f"{written}, {health['sinks']['spool']['exported']} / {health['sinks']['spool']['dropped']}"
    )


@pytest.mark.slow
def test_a_cap_smaller_than_the_first_batch_writes_what_fits(tmp_path):
    # The script flushes every 10 batches (a file of about 3 kB and more): 2.5 kB holds a few spans.
    cap = 2_500
    health, lines, path = trouble(tmp_path, "cap", CIRRON_SPOOL_MAX_BYTES=str(cap))
    assert_reported_once(lines, "spool_max_bytes")
    assert_accounted(health)
    spool = health["sinks"]["spool"]
    written = sum(os.path.getsize(f) for f in ci.exporters.spool_files(str(path)))
    assert 0 < written <= cap and spool["dropped"] > 0
    assert 0 < spool["exported"] < 10  # part of the first flush, split at the cap
    assert assert_spool_intact(path) == spool["exported"]


@pytest.mark.slow
def test_a_file_where_the_spool_directory_should_be(tmp_path):
    health, lines, path = trouble(tmp_path, "not-a-directory")
    assert_reported_once(lines, "not a directory")
    assert_accounted(health)
    assert health["sinks"]["spool"]["exported"] == 0
    assert path.read_text() == "a file where the spool directory should be"  # untouched


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_read_only_spool_directory(tmp_path):
    health, lines, path = trouble(tmp_path, "read-only")
    assert_reported_once(lines, "Permission denied")
    assert_accounted(health)
    assert os.listdir(path / "spool") == []


def _index(span: dict) -> int | None:
    for item in span.get("attributes", []):
        if item["key"] == "index":
            return int(item["value"]["intValue"])
    return None
