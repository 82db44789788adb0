from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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


# The reliability suite's measured figures (tests/reliability/). They are kept here, not in
# its own conftest, because under pytest-xdist only this conftest is loaded where the summary
# is printed: each worker hands its figures to the controller at its end.
_FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    """Record a measured figure: ``figures["backend down: speed ratio"] = 1.02``."""
    return _FIGURES


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker
        workeroutput["cirron_figures"] = json.dumps(_FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """An xdist worker ended: its figures join the controller's."""
    _FIGURES.update(json.loads(getattr(node, "workeroutput", {}).get("cirron_figures", "{}")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("cirron reliability figures")
    for key, value in _FIGURES.items():
        terminalreporter.write_line(f"{key}: {value}")
    target = os.environ.get("CIRRON_FIGURES")
    if target:
        with open(target, "w", encoding="utf-8") as stream:
            json.dump(_FIGURES, stream, indent=2, sort_keys=True)
