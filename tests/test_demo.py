"""The demo (examples/train_torch.py, what scripts/demo.sh runs) as a newcomer runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from otlp_receiver import free_port
from support import clean_environment

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
DEMO = Path(__file__).resolve().parents[1] / "examples" / "train_torch.py"


def test_with_a_dead_endpoint_the_exit_line_says_what_each_sink_delivered(tmp_path):
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", "1"], cwd=tmp_path, capture_output=True,
        text=True, timeout=180,
        env=clean_environment(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
                              CIRRON_EXIT_TIMEOUT="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if "spans recorded" in x)
    found = re.search(r"(\d+) spans recorded; delivered: spool (\d+), otlp 0", line)
    assert found and found.group(1) == found.group(2), line  # the spool has them all
    assert "run `cirron export` to send the spool's spans to the OTLP endpoint" in line


def test_the_demo_ends_with_no_warning(tmp_path):
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", "1"], cwd=tmp_path, capture_output=True,
        text=True, timeout=180, env=clean_environment(),
    )  # fmt: skip
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    assert "spans recorded; delivered: spool " in result.stdout
    # The venv is not activated: the commands to type next are given with their path, and how
    # to make the README's `cirron ...` work as written.
    last = result.stdout.splitlines()[-1]
    assert "bin/cirron show --diagnose` says what it found" in last, last
    assert "bin/activate`, `cirron ...` works as the README writes it" in last, last
