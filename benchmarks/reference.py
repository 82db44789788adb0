"""The reference SDK (PyPI ``cirron-sdk``), measured side by side in its own interpreter.

It has the same import name as this package (``cirron``), so it lives in a
venv of its own (``bash scripts/reference-venv.sh`` makes ``.venv-ref``) and
runs in a subprocess. A measurement is a self-contained snippet of Python
that ends by printing its result with :data:`REPORT`; run the *same* snippet
with :func:`run_snippet` under both interpreters and compare::

    from benchmarks import reference
    code = reference.REPORT_FUNCTION + "import cirron as ci; ...; report({'us': 3.2})"
    ours = reference.run_snippet(code)                    # this interpreter
    python = reference.reference_python()                 # None: not installed
    theirs = reference.run_snippet(code, python) if python else None

Most rows do not write their measurement as a string: :func:`call_snippet`
makes a snippet that imports a function of this ``benchmarks`` package and
reports what it returns. Such a function imports ``cirron`` itself, so the
very same code measures whichever SDK the interpreter has installed, and
:func:`run_both` runs it under both interpreters in alternation.

The snippet runs in a fresh temporary directory (so ``./.cirron`` files of
either SDK land there and vanish), with ``CIRRON_*``/``OTEL_*`` variables
removed from its environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT_VARIABLE = "CIRRON_REFERENCE_PYTHON"  # an interpreter with cirron-sdk installed
VERSION = "0.3.0"
_MARKER = "#cirron-benchmark-result "
REPORT_FUNCTION = (
    f"def report(value):\n    import json\n    print({_MARKER!r} + json.dumps(value), flush=True)\n"
)


class SnippetFailed(RuntimeError):
    """The snippet exited non-zero or reported nothing."""


def _interpreter(variable: str, default: Path) -> str | None:
    """``$variable`` when set (empty: none), else ``default``; None unless it is executable."""
    configured = os.environ.get(variable)
    if configured is not None:
        path = Path(configured.strip()) if configured.strip() else None
    else:
        path = default
    if path is None or not path.is_file() or not os.access(path, os.X_OK):
        return None
    return str(path)


def reference_python() -> str | None:
    """The interpreter of the reference SDK, or None when it is not installed.

    ``$CIRRON_REFERENCE_PYTHON`` when set (empty: none), else ``.venv-ref/bin/python``.
    """
    return _interpreter(ENVIRONMENT_VARIABLE, ROOT / ".venv-ref" / "bin" / "python")


def frameworks_pythons() -> tuple[str | None, str | None]:
    """Interpreters with TensorFlow and transformers installed beside torch: (ours, reference's).

    ``$CIRRON_FRAMEWORKS_PYTHON`` / ``$CIRRON_REFERENCE_FRAMEWORKS_PYTHON`` when set,
    else ``.venv-frameworks`` / ``.venv-ref-frameworks`` (``bash
    scripts/frameworks-venvs.sh`` makes both); None for one that is missing.
    """
    return (
        _interpreter("CIRRON_FRAMEWORKS_PYTHON", ROOT / ".venv-frameworks" / "bin" / "python"),
        _interpreter(
            "CIRRON_REFERENCE_FRAMEWORKS_PYTHON",
            ROOT / ".venv-ref-frameworks" / "bin" / "python",
        ),
    )


def call_snippet(module: str, function: str, **arguments: Any) -> str:
    """A snippet that reports ``benchmarks.<module>.<function>(**arguments)``.

    Only this repository's root goes on ``sys.path`` (not ``src/``), so
    ``import cirron`` in the function finds the interpreter's own SDK.
    """
    return REPORT_FUNCTION + (
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        f"from benchmarks.{module} import {function}\n"
        f"report({function}(**{arguments!r}))\n"
    )


def run_both(
    code: str, runs: int, pythons: tuple[str | None, str | None] | None = None
) -> tuple[list[Any], list[Any] | None]:
    """``code`` under our interpreter, then the reference's, ``runs`` times in alternation.

    ``pythons``: (ours, the reference's); by default this interpreter and
    :func:`reference_python`. Returns (our results, the reference's results or
    None when it is not installed); alternating the fresh processes lets the
    machine's drift hit both SDKs alike.
    """
    ours_python, python = pythons if pythons is not None else (None, reference_python())
    ours: list[Any] = []
    theirs: list[Any] = []
    for _ in range(runs):
        ours.append(run_snippet(code, ours_python))
        if python:
            theirs.append(run_snippet(code, python))
    return ours, theirs if python else None


def dropped(health: dict[str, Any]) -> dict[str, int]:
    """Spans, marks and spool files an SDK lost, read from either SDK's ``ci.health()``.

    Ours counts every span any sink lost, once, in ``spans_dropped``; the
    reference's spool counts the whole files it evicted over its size cap.
    """
    if "scope_drop_count" in health:  # the reference SDK's keys
        return {
            "spans": int(health["scope_drop_count"]),
            "marks": int(health["mark_drop_count"]),
            "files": int(health["spool_drop_count"]),
        }
    return {
        "spans": int(health["spans_dropped"]),
        "marks": int(health["marks_dropped"]),
        "files": 0,
    }


def snippet_environment() -> dict[str, str]:
    """This process's environment without what would configure an SDK in a snippet's process
    (``CIRRON_*``, ``OTEL_*``, a ``TRACEPARENT`` to join)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CIRRON_", "OTEL_")) and key != "TRACEPARENT"
    }


def run_snippet(code: str, python: str | None = None, timeout: float = 600) -> Any:
    """Run ``code`` under ``python`` (default: this interpreter); returns what it reported."""
    environment = snippet_environment()
    with tempfile.TemporaryDirectory(prefix="cirron-bench-") as directory:
        result = subprocess.run(
            [python or sys.executable, "-c", code],
            cwd=directory,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    reports = [line for line in result.stdout.splitlines() if line.startswith(_MARKER)]
    if result.returncode != 0 or not reports:
        raise SnippetFailed(
            f"{python or sys.executable} exited {result.returncode}: {result.stderr[-2000:]}"
        )
    return json.loads(reports[-1][len(_MARKER) :])
