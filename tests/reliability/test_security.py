"""Promise 8: private files, secrets kept, nothing sent unasked, hostile values contained.

- Spool files and directories get the user's umask and are never writable by
  others, whatever the umask (snapshot files: ``tests/test_snapshots.py::
  test_snapshot_files_are_never_writable_by_others_whatever_the_umask``).
- OTLP headers (API keys) reach the backend and nowhere else: not the log (at
  DEBUG, with a backend refusing them), not the spool, not ``ci.health()``.
- Without an OTLP endpoint cirron opens no socket at all (an audit hook
  watches), even with headers configured and torch training.
- Control characters, separators, lone surrogates and 10 MB strings in marks,
  attributes, names and exceptions leave every spool file valid JSON of
  bounded size and every stdout/log line one line.
"""

from __future__ import annotations

import json
import os
import stat
import unicodedata

import pytest
from faults import SCRIPTS, ErrorServer, assert_spool_intact, run_steady

import cirron as ci
from cirron.otel.values import MAX_VALUE_LENGTH
from support import SPOOL_FILES, run_python, run_script, spool_text

# -- files: the user's umask, never world-writable ---------------------------------------

UMASK_SCRIPT = r"""
import json, os
import cirron as ci
from cirron.otel.values import MAX_VALUE_LENGTH

modes = {}
for umask in (0o000, 0o002, 0o022, 0o077):
    os.umask(umask)
    root = f"root-{umask:03o}"
    ci.profile(path=os.path.join(root, "deeper", "trace"), frameworks=[])
    with ci.scope("work"):
        pass
    ci.shutdown()
    for directory, _dirs, files in os.walk(root):
        modes[directory] = ["dir", umask, os.stat(directory).st_mode & 0o777]
        for name in files:
            full = os.path.join(directory, name)
            modes[full] = ["file", umask, os.stat(full).st_mode & 0o777]
print(json.dumps(modes))
"""


@pytest.mark.slow
def test_spool_files_and_directories_take_the_umask_and_are_never_world_writable(tmp_path):
    result = run_python(UMASK_SCRIPT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    modes = json.loads(result.stdout.strip().splitlines()[-1])
    files = [path for path, (kind, _umask, _mode) in modes.items() if kind == "file"]
    # Each of the four profilers wrote a spool file and a metrics file.
    assert sum(os.sep + "spool" + os.sep in path for path in files) == 4
    assert sum(os.sep + "metrics" + os.sep in path for path in files) == 4
    for path, (kind, umask, mode) in modes.items():
        expected = (0o775 if kind == "dir" else 0o664) & ~umask
        assert mode == expected, (path, oct(mode), oct(expected))
        assert not mode & stat.S_IWOTH, path


# -- secrets -------------------------------------------------------------------------------

SECRET = "s3cr3t-T0KEN-4f9a"
API_KEY = "k3y-S3CRET-77b1"


@pytest.mark.slow
@pytest.mark.parametrize("status", [401, 503])
def test_otlp_headers_reach_the_backend_and_nowhere_else(tmp_path, status):
    with ErrorServer(status, body=b"denied") as server:
        run = run_steady(
            tmp_path,
            "--batches", "200", "--output", "spool,log,stdout",
            "--log-file", str(tmp_path / "all.log"), "--log-level", "DEBUG",
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.port}",
            OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{SECRET},x-api-key={API_KEY}",
            OTEL_EXPORTER_OTLP_TIMEOUT="1",
            CIRRON_EXIT_TIMEOUT="1",
        )  # fmt: skip
        requests = list(server.requests)
    assert run.returncode == 0, run.stderr[-3000:]
    # The headers were really sent: the test has something to find.
    assert requests and requests[0].get("authorization") == f"Bearer {SECRET}"
    assert requests[0].get("x-api-key") == API_KEY
    log = (tmp_path / "all.log").read_text(encoding="utf-8")
    assert "DEBUG" in log and "[cirron]" in log  # the log really was verbose
    places = {
        "stdout": run.stdout,
        "stderr": run.stderr,
        "log": log,
        "health": json.dumps(run.health) + json.dumps(run.trained),
        "spool": "".join(spool_text(p) for p in (run.path / "spool").glob(SPOOL_FILES)),
    }
    for place, text in places.items():
        for secret in (SECRET, API_KEY):
            assert secret not in text, f"{secret} found in {place}"


AUDIT_SCRIPT = r"""
import json, sys
import torch
import cirron as ci
from cirron.otel.values import MAX_VALUE_LENGTH

opened = []
WATCHED = ("socket.__new__", "socket.connect", "socket.sendto", "socket.sendmsg",
           "socket.getaddrinfo", "socket.bind", "http.client.connect", "urllib.Request")

def audit(event, args):
    if event in WATCHED:
        opened.append(f"{event} {args!r}"[:300])

sys.addaudithook(audit)
ci.profile(output=["spool", "stdout", "log"], flush_interval=0.05)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
for epoch in ci.epochs(range(2)):
    for x, y in torch.utils.data.DataLoader(data, batch_size=8):
        with ci.scope("step-work"):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ci.mark("loss", loss.item())
ci.flush()
health = ci.health()
ci.shutdown()
print("RESULT " + json.dumps({"opened": opened, "transport": health["transport"],
                              "exported": health["spans_exported"]}))
"""


@pytest.mark.slow
def test_nothing_is_sent_anywhere_without_an_endpoint(tmp_path):
    pytest.importorskip("torch")
    # Headers and a service name configured, but no endpoint: no socket, not even a lookup.
    result = run_python(
        AUDIT_SCRIPT,
        cwd=tmp_path,
        timeout=120,
        env={"OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={API_KEY}", "OTEL_SERVICE_NAME": "quiet"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    report = json.loads(line.removeprefix("RESULT "))
    assert report["opened"] == []
    assert report["transport"] == "file" and report["exported"] > 10
    assert ci.spool_spans(str(tmp_path / ".cirron"))


# -- hostile values ------------------------------------------------------------------------


def _raw_control(line: str) -> list[str]:
    """Characters that would break a terminal line or a log record."""
    return [c for c in line if unicodedata.category(c) in ("Cc", "Zl", "Zp", "Cs")]


@pytest.mark.slow
def test_hostile_values_leave_every_file_valid_and_every_line_one_line(tmp_path, figures):
    log_file = tmp_path / "cirron.log"
    result = run_script(
        SCRIPTS / "hostile_values.py", str(tmp_path / "trace"), str(log_file),
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""
    out_lines = result.stdout.splitlines()
    report = json.loads(out_lines[-1].removeprefix("RESULT "))
    health = report["health"]
    assert health["export_errors"] == health["spans_dropped"] == 0

    # The spool: strict JSON, every span once, bounded by the 8192-character value cut.
    path = tmp_path / "trace"
    assert assert_spool_intact(path) == report["spans"] == health["spans_ended"]
    size = sum(os.path.getsize(f) for f in ci.exporters.spool_files(str(path)))
    assert size < 1_000_000, size  # five 10 MB strings went in
    spans = ci.spool_spans(str(path))
    hostile = sorted((s for s in spans if s["name"] == "hostile"), key=_index)
    values = [_attribute(s, "value") for s in hostile]
    assert len(values[-1]) == MAX_VALUE_LENGTH == 8192
    assert values[:-1] == [  # each nasty string back exactly, the lone surrogate included
        "line\nbreak",
        "carriage\rreturn",
        "nul\x00byte",
        "\x1b[31mred\x1b[0m",
        "tab\tand\vvertical\ffeed",
        "separators\u2028\u2029",
        "lone \ud800 surrogate",
        '{"json": "injection"}\n[cirron] fake line',
        "\x7f\x85 del and nel",
    ]
    (failing,) = [s for s in spans if s["name"] == "failing"]
    assert len(failing["status"]["message"]) <= MAX_VALUE_LENGTH

    # stdout: one line per span, nothing raw, bounded; the fake "[cirron]" line stayed inside.
    lines = [line for line in out_lines if line.startswith("[cirron] ")]
    assert len(lines) == report["spans"]
    assert len(out_lines) == len(lines) + 1  # and the RESULT line
    for line in lines:
        assert _raw_control(line) == [], line
        assert len(line) < 4096, len(line)
    # The log file: one record per line, each starting with its logger's name.
    records = log_file.read_text(encoding="utf-8").splitlines()
    assert all(record.startswith("cirron") for record in records), records[:3]
    assert sum("[cirron] " in record for record in records) == report["spans"]
    for record in records:
        assert _raw_control(record) == [], record
    figures["hostile values: spool bytes for five 10 MB strings, longest line"] = (
        f"{size}, {max(len(line) for line in lines)}"
    )


def _index(span: dict) -> int:
    return int(_attribute(span, "index"))


def _attribute(span: dict, key: str) -> object:
    for item in span["attributes"]:
        if item["key"] == key:
            ((_kind, value),) = item["value"].items()
            return value
    raise KeyError(key)
