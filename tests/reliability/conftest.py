"""The reliability suite: the promises of the README's "What cirron promises", one file each.

Tests here run real training scripts as subprocesses, send real signals and
talk to real servers (a black hole, an erroring HTTP server, the ``rotel``
collector). What they measure (training speed with the backend down, what
SIGKILL lost, ...) goes into ``figures`` and is printed at the end of the run
("cirron reliability figures"); with ``CIRRON_FIGURES=<file>`` it is also
written there as JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    """Record a measured figure: ``figures["backend down: speed ratio"] = 1.02``."""
    return _FIGURES


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
