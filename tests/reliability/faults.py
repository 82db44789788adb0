"""Fault injection for the reliability suite: broken backends, and runs of a real training script.

- :class:`BlackHole`: a TCP server that accepts connections and never answers.
- :class:`ErrorServer`: an HTTP server answering every request with one status
  (503, 500, 401, ...), remembering the headers it was sent.
- :func:`closed_port`: a port nothing listens on (connections are refused).
- :func:`run_steady` / :class:`SteadyRun`: ``scripts/steady_train.py`` as a
  subprocess, its reports parsed.
- :func:`assert_spool_intact`: every spool file is whole, valid OTLP/JSON.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import clean_environment, spool_text

SCRIPTS = Path(__file__).parent / "scripts"


class BlackHole:
    """A local TCP server that accepts connections and never answers."""

    def __init__(self, port: int = 0) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="black-hole", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(connection)  # hold it open, read nothing, answer nothing
            self.accepted += 1

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()
        for connection in self._held:
            connection.close()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ErrorServer:
    """An HTTP server that answers every request with ``status`` and remembers what it got."""

    def __init__(self, status: int, port: int = 0, body: bytes = b"") -> None:
        self.status = status
        self.requests: list[dict[str, str]] = []  # the headers of each request
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests.append(dict(self.headers.items()))
                self.send_response(owner.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> ErrorServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def closed_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago: connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SteadyRun:
    """What ``scripts/steady_train.py`` reported, and how its process ended."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float  # from start to exit
    ended_at: float  # CLOCK_MONOTONIC at exit
    path: Path
    statuses: list[dict[str, Any]] = field(default_factory=list)
    trained: dict[str, Any] = field(default_factory=dict)
    health: dict[str, Any] = field(default_factory=dict)  # after ci.shutdown()

    @property
    def exit_seconds(self) -> float | None:
        """From the end of the training script to the end of the process."""
        for line in self.stderr.splitlines():
            if line.startswith("main-done-at "):
                return self.ended_at - float(line.split()[1])
        return None

    def warnings(self) -> list[str]:
        """The lines logged on stderr (Python's last-resort handler prints WARNING and up)."""
        return [
            line
            for line in self.stderr.splitlines()
            if line.strip() and not line.startswith("main-done-at ")
        ]


def parse_reports(stdout: str) -> dict[str, list[dict[str, Any]]]:
    reports: dict[str, list[dict[str, Any]]] = {}
    for line in stdout.splitlines():
        kind, _, text = line.partition(" ")
        if kind in ("STATUS", "TRAINED", "HEALTH") and text.startswith("{"):
            reports.setdefault(kind, []).append(json.loads(text))
    return reports


def run_steady(directory: Path, *args: str, timeout: float = 60, **environment: str) -> SteadyRun:
    """Run ``steady_train.py`` with its spool under ``directory``; ``args`` are its options."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "trace"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "steady_train.py"), str(path), *args],
        cwd=directory,
        env=clean_environment(**environment),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    ended = time.monotonic()
    reports = parse_reports(result.stdout)
    return SteadyRun(
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr,
        seconds=ended - started,
        ended_at=ended,
        path=path,
        statuses=reports.get("STATUS", []),
        trained=(reports.get("TRAINED") or [{}])[-1],
        health=(reports.get("HEALTH") or [{}])[-1],
    )


def _strict_json(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def assert_spool_intact(path: Path, temporary_allowed: bool = False) -> int:
    """Every spool file under ``path`` is whole, strict OTLP/JSON; returns the span count.

    A reader lists ``<pid>-<seq>.json.gz`` (``.json``); anything else in the directory may only
    be a temporary file of a write cut short by SIGKILL (``temporary_allowed``).
    """
    directory = path / "spool"
    if not directory.exists():
        return 0
    spans = 0
    for name in sorted(os.listdir(directory)):
        full = directory / name
        if name.startswith(".") and name.endswith(".tmp"):
            assert temporary_allowed, f"a temporary file was left behind: {name}"
            continue
        pid, dash, sequence = name.removesuffix(".gz").removesuffix(".json").partition("-")
        assert name.endswith((".json", ".json.gz")), name
        assert dash and pid.isdigit() and sequence.isdigit(), name
        text = spool_text(full)
        assert text.isascii(), name
        request = _strict_json(text)
        for resource_spans in request["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                spans += len(scope_spans["spans"])
    return spans
