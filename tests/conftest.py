from __future__ import annotations

import os
from pathlib import Path

import pytest

import cirron as ci
from support import duplicate_span_ids

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_cirron(tmp_path, monkeypatch):
    """Every test starts with no profiler, in its own directory, and ends the same way.

    And whatever it spooled holds each span id once.
    """
    monkeypatch.chdir(tmp_path)
    for variable in list(os.environ):
        if variable.startswith(("CIRRON_", "OTEL_")) or variable in ("TRACEPARENT", "RANK"):
            monkeypatch.delenv(variable)
    _reset()
    yield
    _reset()
    assert duplicate_span_ids(tmp_path) == {}, "a span id is in the spool twice"


@pytest.fixture(scope="session", autouse=True)
def no_span_id_twice_in_any_spool(tmp_path_factory):
    """The same check for spools of shared fixtures (module-scoped runs, servers)."""
    yield
    assert duplicate_span_ids(tmp_path_factory.getbasetemp()) == {}


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test (the 2-core machine runs other work beside it)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    """A real OTLP receiver (rotel) for the tests of one module; stopped, for sure, after them."""
    from otlp_receiver import OtlpReceiver

    rotel = OtlpReceiver(str(tmp_path_factory.mktemp("rotel")))
    rotel.start()
    try:
        yield rotel
    finally:
        rotel.stop()
        assert rotel.process is None


def _reset() -> None:
    import cirron.profiler

    ci.shutdown()
    ci.shutdown()  # the second call also drops an in-memory recorder
    cirron.profiler._last = None
