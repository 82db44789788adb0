"""Helpers for tests that need a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def run_python(
    code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (fresh globals, fresh OTel provider)."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CIRRON_", "OTEL_")) and k != "TRACEPARENT"
    }
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
