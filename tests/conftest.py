from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
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


# Under pytest-xdist (scripts/test.sh), a test marked ``alone`` runs with no test of the other
# process beside it, its module's shared fixtures included: what it asserts (a speed ratio,
# that nothing competed for the CPU) holds on a machine as quiet as a run on one process.
# Every other test takes a shared turn; an ``alone`` one waits for the running ones to end and
# holds back new ones (the gate) until it has ended.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:  # one process: every test is alone
        return (yield)
    with _turn(_lock_prefix(workerinput), alone=item.get_closest_marker("alone") is not None):
        return (yield)


def _lock_prefix(workerinput: dict[str, Any]) -> str:
    return os.path.join(tempfile.gettempdir(), f"cirron-tests-{workerinput['testrunuid']}")


@contextlib.contextmanager
def _turn(prefix: str, alone: bool) -> Iterator[None]:
    with open(prefix + ".gate", "a") as gate, open(prefix + ".run", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases the locks


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """An xdist worker ended: its figures join the controller's; its lock files go."""
    _FIGURES.update(json.loads(getattr(node, "workeroutput", {}).get("cirron_figures", "{}")))
    for suffix in (".gate", ".run"):
        with contextlib.suppress(OSError, KeyError, AttributeError):
            os.remove(_lock_prefix(node.workerinput) + suffix)
