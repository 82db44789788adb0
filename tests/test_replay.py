"""``cirron export --endpoint``: every span of the spool reaches the backend once.

The backend is a real collector (``rotel``); the runs and the command are real
subprocesses. What the live OTLP sink delivered is not sent again, an export
killed half-way resumes where it stopped, a dead endpoint ends the export at
once in one line, and ``--all`` sends everything again on purpose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cirron.exporters import spool_spans, undelivered_spans
from otlp_receiver import OtlpReceiver
from support import cirron, clean_environment

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
BATCH = 512  # spans per request of an export

SCOPES = """
    import sys
    import cirron as ci
    ci.profile(path=sys.argv[1], flush_interval=0.2)
    for _ in range(int(sys.argv[2])):
        with ci.scope("s"):
            pass
"""


def spooled_run(directory: Path, scopes: int, **environment: str) -> Path:
    """A run of ``scopes`` scopes (and its session) spooled under ``directory/trace``."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "scopes.py"
    script.write_text(textwrap.dedent(SCOPES))
    path = directory / "trace"
    result = subprocess.run(
        [sys.executable, str(script), str(path), str(scopes)],
        cwd=directory,
        env=clean_environment(**environment),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return path


def span_ids(path: Path) -> set[str]:
    return {span["spanId"] for span in spool_spans(str(path))}


def received(receiver: OtlpReceiver, expected: set[str], timeout: float = 60) -> dict[str, int]:
    """How often each span id reached the receiver, once every one of ``expected`` has."""
    receiver.wait_for(lambda _text: expected <= set(receiver.span_id_counts()), timeout=timeout)
    return dict(receiver.span_id_counts())


def settled(receiver: OtlpReceiver) -> dict[str, int]:
    """The counts once the receiver printed nothing new for a while (it batches ~200 ms)."""
    receiver.wait_for(lambda _text: True, timeout=5, interval=0.5)
    return dict(receiver.span_id_counts())


@pytest.fixture
def receiver():
    with OtlpReceiver() as receiver:
        yield receiver


def test_an_export_after_a_run_that_delivered_everything_sends_nothing(tmp_path, receiver):
    path = spooled_run(tmp_path, 80, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint)
    expected = span_ids(path)
    assert len(expected) == 81
    received(receiver, expected)

    export = cirron("export", str(path), "--endpoint", receiver.http_endpoint, cwd=tmp_path)

    assert export.returncode == 0, export.stderr
    assert export.stderr.strip().splitlines() == [
        f"cirron: 0 spans sent to {receiver.traces_url}, 81 it had already"
    ]
    assert settled(receiver) == {span: 1 for span in expected}
    assert undelivered_spans(str(path), receiver.http_endpoint) == set()


def test_all_sends_everything_again_on_purpose(tmp_path, receiver):
    path = spooled_run(tmp_path, 20, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint)
    expected = span_ids(path)
    received(receiver, expected)

    export = cirron("export", str(path), "--endpoint", receiver.traces_url, "--all", cwd=tmp_path)

    assert export.returncode == 0 and "21 spans sent" in export.stderr
    receiver.wait_for(lambda _text: set(receiver.span_id_counts().values()) == {2}, timeout=30)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_an_export_sends_each_span_once_however_often_it_runs(tmp_path, receiver, protocol):
    path = spooled_run(tmp_path, 1500)  # no endpoint while it ran: nothing delivered yet
    expected = span_ids(path)
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    command = ("export", str(path), "--endpoint", endpoint, "--protocol", protocol)

    first = cirron(*command, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "1501 spans sent" in first.stderr
    again = cirron(*command, cwd=tmp_path)
    assert "0 spans sent" in again.stderr and "1501 it had already" in again.stderr

    assert received(receiver, expected) == {span: 1 for span in expected}
    assert settled(receiver) == {span: 1 for span in expected}


def test_an_export_killed_half_way_resumes_at_the_first_batch_not_acknowledged(tmp_path, receiver):
    path = spooled_run(tmp_path, 30_000)
    expected = span_ids(path)
    assert len(expected) == 30_001
    command = [str(BIN / "cirron"), "export", str(path), "--endpoint", receiver.http_endpoint]
    export = subprocess.Popen(command, cwd=tmp_path, env=clean_environment(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    ledger = path / "delivered"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and acknowledged_bytes(ledger) < 24 * BATCH * 5:
        time.sleep(0.005)
    export.send_signal(signal.SIGKILL)  # mid-export: five batches or more acknowledged
    export.communicate(timeout=30)
    done = acknowledged_bytes(ledger) // 24
    assert BATCH * 5 <= done < len(expected), "the export was not killed half-way"

    resumed = cirron("export", str(path), "--endpoint", receiver.http_endpoint, cwd=tmp_path)

    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(expected) - done} spans sent" in resumed.stderr
    counts = received(receiver, expected, timeout=120)
    assert set(counts) == expected  # every span ...
    twice = [span for span, count in counts.items() if count > 1]
    assert len(twice) <= BATCH and max(counts.values()) <= 2  # ... at most the batch in flight


def acknowledged_bytes(ledger: Path) -> int:
    return sum(f.stat().st_size for f in ledger.rglob("*.ids")) if ledger.exists() else 0


def test_a_dead_endpoint_ends_the_export_at_once_in_one_line(tmp_path, receiver):
    path = spooled_run(tmp_path, 10)
    started = time.monotonic()
    dead = cirron("export", str(path), "--endpoint", "http://127.0.0.1:9", cwd=tmp_path)
    assert time.monotonic() - started < 5
    assert dead.returncode == 1
    (line,) = dead.stderr.strip().splitlines()
    assert "0 spans sent" in line and "11 not sent: connection refused" in line
    # Nothing was noted as delivered: the live endpoint gets everything afterwards.
    later = cirron("export", str(path), "--endpoint", receiver.http_endpoint, cwd=tmp_path)
    assert later.returncode == 0 and "11 spans sent" in later.stderr


def test_an_endpoint_that_never_answers_is_given_up_after_the_timeout(tmp_path):
    import socket

    path = spooled_run(tmp_path, 10)
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = cirron("export", str(path), "--endpoint", endpoint, "--timeout", "1", cwd=tmp_path)
        took = time.monotonic() - started
    assert result.returncode == 1 and "timed out" in result.stderr
    assert took < 5
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (("--endpoint", "127.0.0.1:4318"), "--endpoint must be an http:// or https:// URL"),
        (("--endpoint", "http://127.0.0.1:4318", "--timeout", "0"), "--timeout must be seconds"),
        (("--endpoint", "http://127.0.0.1:4318", "--timeout", "inf"), "at most 3600, got inf"),
        (("--endpoint", "http://127.0.0.1:99999"), "Port out of range"),
        (("--endpoint", "http://[::1"), "--endpoint 'http://[::1' is not a usable address"),
        (("--protocol", "grpc", "--endpoint", "localhost:port"), "--endpoint 'localhost:port'"),
        (("--format", "chrome", "-o", "/nonexistent/dir/trace.json"), "no such directory"),
        (("--endpoint", "http://127.0.0.1:4318", "--header", "novalue"), "--header must be"),
    ],
)
def test_argument_errors_are_said_once_before_any_work(tmp_path, arguments, says):
    path = spooled_run(tmp_path, 2)
    result = cirron("export", str(path), *arguments, cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert says in line and line.startswith("cirron: ")
    assert not (path / "delivered").exists()
    assert "Traceback" not in result.stderr


def test_a_terminal_sees_a_progress_bar_and_a_pipe_sees_one_line(tmp_path, receiver):
    import pty

    path = spooled_run(tmp_path, 3000)
    command = [str(BIN / "cirron"), "export", str(path), "--endpoint", receiver.http_endpoint]
    leader, follower = pty.openpty()
    with subprocess.Popen(
        command,
        cwd=tmp_path,
        env=clean_environment(COLUMNS="100"),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
    ) as export:
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the command ended and closed its side
                break
            if not chunk:
                break
            seen += chunk
        assert export.wait(timeout=60) == 0
    os.close(leader)
    text = seen.decode(errors="replace")
    assert "/3001" in text and "spans/s" in text  # the bar: done of the total, the rate
    assert text.rstrip().splitlines()[-1].endswith("3001 spans sent to " + receiver.traces_url)
    piped = cirron("export", str(path), "--endpoint", receiver.http_endpoint, "--all",
                   cwd=tmp_path)  # fmt: skip
    assert piped.stderr.count("\n") == 1  # no bar where nobody watches


def test_an_export_that_could_not_note_what_it_sent_sends_nothing(tmp_path, receiver):
    path = spooled_run(tmp_path, 10)
    (path / "delivered").write_text("a file where the ledger's folder goes")
    result = cirron("export", str(path), "--endpoint", receiver.http_endpoint, cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("cirron: cannot note what") and "nothing sent" in line
    assert settled(receiver) == {}  # else every later export would send them all again
    (path / "delivered").unlink()
    later = cirron("export", str(path), "--endpoint", receiver.http_endpoint, cwd=tmp_path)
    assert later.returncode == 0 and "11 spans sent" in later.stderr
    assert set(received(receiver, span_ids(path)).values()) == {1}


def test_a_ledger_that_fails_half_way_stops_the_export_and_says_what_to_do(tmp_path):
    import shutil

    from cirron.exporters import spool_reader
    from cirron.exporters.ledger import Ledger
    from cirron.offline import replay

    path = spooled_run(tmp_path, BATCH + 100)
    spans = [s for read in spool_reader.read_files(spool_reader.spool_files(str(path)))
             for s in read.spans]  # fmt: skip
    ledger = Ledger(str(path), "http://127.0.0.1:4318")
    ledger.prepare()
    batches = []

    def send(batch):  # the endpoint takes it; then the disk refuses the ledger its note
        batches.append(len(batch))
        shutil.rmtree(ledger.directory)
        Path(ledger.directory).write_text("")

    outcome = replay.replay(spans, ledger, send)
    assert batches == [BATCH]  # no second batch: it would be sent again by the next export
    assert outcome.sent == BATCH and outcome.unsent == len(spans) - BATCH
    assert "could not be noted" in outcome.stopped
    assert outcome.retry == "once that folder can be written"
