from __future__ import annotations

import os
from pathlib import Path

import pytest

import cirron as ci

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_cirron(tmp_path, monkeypatch):
    """Every test starts with no profiler, in its own directory, and ends the same way."""
    monkeypatch.chdir(tmp_path)
    for variable in list(os.environ):
        if variable.startswith(("CIRRON_", "OTEL_")) or variable in ("TRACEPARENT", "RANK"):
            monkeypatch.delenv(variable)
    _reset()
    yield
    _reset()


def _reset() -> None:
    import cirron.profiler

    ci.shutdown()
    ci.shutdown()  # the second call also drops an in-memory recorder
    cirron.profiler._last = None
