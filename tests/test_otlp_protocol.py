"""OTLP to a collector on the standard ports, as a new user types it.

A collector listens for OTLP/gRPC on 4317 and OTLP/HTTP on 4318. The zero-code commands of the
docs' Zero-code page and of the README are run exactly as written (read from those files), and
``ci.profile()`` with nothing but an
endpoint picks the protocol that port stands for. The receiver is the real one (rotel) on those
very ports; the tests are skipped when something else holds them.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import support
from cirron.exporters import spool_spans

try:
    from otlp_receiver import OtlpReceiver
except ImportError:  # pragma: no cover - run from the repository root
    from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAIN = """
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    print("TRAINED")
"""


def _taken(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    """A real receiver on 4317 (gRPC) and 4318 (HTTP), the ports a collector listens on."""
    if _taken(4317) or _taken(4318):
        pytest.skip("ports 4317/4318 are taken on this machine")
    rotel = OtlpReceiver(str(tmp_path_factory.mktemp("rotel")))
    rotel.start(attempts=1, ports=(4317, 4318))
    try:
        yield rotel
    finally:
        rotel.stop()


# Where a user reads the zero-code commands: the guide's page, and the README's summary of it.
ZERO_CODE_PAGES = (ROOT / "docs" / "guide" / "zero-code.md", ROOT / "README.md")


def documented_zero_code_commands() -> list[str]:
    """The commands of the first bash block under each page's zero-code heading, continuation
    lines joined, each command once."""
    commands = []
    for page in ZERO_CODE_PAGES:
        section = page.read_text().split("# Zero-code: `opentelemetry-instrument`", 1)[1]
        block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
        assert block is not None, page
        joined = block.group(1).replace("\\\n", " ")
        commands += [line.split("#", 1)[0].strip() for line in joined.splitlines() if line.strip()]
    return list(dict.fromkeys(commands))


def run_command(directory: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` in a shell, with this virtualenv's ``python`` and ``opentelemetry-instrument``
    first on the PATH."""
    (directory / "train.py").write_text(textwrap.dedent(TRAIN))
    environment = support.clean_environment(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        ["bash", "-c", command],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )


def session_id(directory: Path) -> str:
    sessions = [s for s in spool_spans(str(directory / ".cirron")) if s["name"] == "cirron.session"]
    assert len(sessions) == 1
    return str(sessions[0]["spanId"])


def exports_otlp(command: str) -> bool:
    """Whether the command sends traces over OTLP (unset, ``OTEL_TRACES_EXPORTER`` is ``otlp``)."""
    for word in shlex.split(command):
        if word.startswith("OTEL_TRACES_EXPORTER="):
            return "otlp" in word.partition("=")[2].split(",")
    return True


@pytest.mark.parametrize("index", range(len(documented_zero_code_commands())))
def test_each_documented_zero_code_command_works_as_written(tmp_path, collector, index):
    command = documented_zero_code_commands()[index]
    result = run_command(tmp_path, command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRAINED" in result.stdout
    session = session_id(tmp_path)  # every command keeps the spool
    if exports_otlp(command):
        collector.wait_for(lambda text: session in text, timeout=20)
    assert "Failed to export" not in result.stderr


@pytest.mark.parametrize("port", [4317, 4318], ids=["grpc-4317", "http-4318"])
def test_ci_profile_with_only_an_endpoint_picks_the_protocol_of_its_port(tmp_path, collector, port):
    command = f"OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:{port} python profiled.py"
    (tmp_path / "profiled.py").write_text(
        "import cirron as ci\nci.profile()\n" + textwrap.dedent(TRAIN)
    )
    result = run_command(tmp_path, command)
    assert result.returncode == 0, result.stderr[-3000:]
    session = session_id(tmp_path)
    collector.wait_for(lambda text: session in text, timeout=20)
    assert "did not reach the otlp sink" not in result.stderr


def test_zero_code_says_when_the_protocol_does_not_fit_the_port(tmp_path, collector):
    """Unset, opentelemetry-instrument's protocol is gRPC: 4318 needs it set, and cirron says so."""
    result = run_command(
        tmp_path,
        "OTEL_TRACES_EXPORTER=cirron_spool OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none "
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 opentelemetry-instrument python train.py",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in result.stderr
