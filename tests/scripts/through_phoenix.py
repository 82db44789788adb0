"""Arize Phoenix, a traced run sent to it over OTLP/HTTP, and its spans read back from its API.

Run in a network namespace of its own: ``unshare -n -- python through_phoenix.py PHOENIX DIR``
(``PHOENIX``: its ``phoenix`` command; ``DIR``: a directory for its database). Phoenix's gRPC
port binds every interface whatever it is told, so here the only interface is loopback, and
its ports can be fixed. Brings loopback up, starts ``phoenix serve`` (bounded wait on
``/healthz``), runs ``serve_llm.py --profile`` exporting to it, polls
``/v1/projects/default/spans`` until the LLM span is there, stops Phoenix, and prints one
JSON line: ``{"run": <the script's line>, "spans": [<Phoenix's spans>]}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PORT, GRPC_PORT = 6006, 4317  # nothing else listens in a namespace of its own
BASE = f"http://127.0.0.1:{PORT}"
SCRIPT = Path(__file__).resolve().parent / "serve_llm.py"


def _get(path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(BASE + path, timeout=5) as answer:
            return answer.status, answer.read()
    except OSError:
        return 0, b""


def _wait(what: str, ready: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise SystemExit(f"through_phoenix: {what} not there after {timeout:.0f} s")


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(phoenix: str, directory: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    environment = dict(
        os.environ,
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(PORT),
        PHOENIX_GRPC_PORT=str(GRPC_PORT),
        PHOENIX_WORKING_DIR=str(directory),
        PHOENIX_TELEMETRY_ENABLED="false",
        PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
    )
    with open(directory / "phoenix.log", "w") as log:
        server = subprocess.Popen(
            [phoenix, "serve"], env=environment, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
    try:
        _wait("Phoenix", lambda: _get("/healthz")[0] == 200, timeout=120)
        run = subprocess.run(
            [sys.executable, str(SCRIPT), "--profile"],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CIRRON_"))},
                "OTEL_EXPORTER_OTLP_ENDPOINT": BASE,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_SERVICE_NAME": "serve_llm",
                "CIRRON_METRICS": "false",
            },
            cwd=directory, capture_output=True, text=True, timeout=180, check=True,
        )  # fmt: skip
        spans: list[dict] = []

        def arrived() -> bool:
            status, body = _get("/v1/projects/default/spans?limit=1000")
            spans[:] = json.loads(body)["data"] if status == 200 else []
            return any(span["span_kind"] == "LLM" for span in spans)

        _wait("the LLM span", arrived, timeout=60)
        print(json.dumps({"run": json.loads(run.stdout.splitlines()[-1]), "spans": spans}))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
