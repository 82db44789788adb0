"""Instructions counted by valgrind's callgrind, for the benchmarks whose timed figures vary
by more than the changes they follow (a shared two-core machine).

A snippet runs the operations to count inside one call of ``functools.reduce`` (its C
function is where callgrind counts, and nothing else of the process is); :func:`instructions_per_step`
runs it under callgrind and divides by the operations. The count moves by a few thousand
instructions from run to run, where a timed pair moves by microseconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from . import reference

# The C function of functools.reduce (CPython 3.10-3.13): callgrind counts inside it only.
_COUNTED = "functools_reduce"
# Prepended to a snippet: the hooks' pure-Python twin, even where the compiled one is built.
PURE_PYTHON = "import os\nos.environ['CIRRON_PURE_PYTHON'] = '1'\n"


def instructions_per_step(code: str, steps: int, python: str | None = None) -> float | None:
    """Instructions a step of ``code`` runs (a snippet whose ``functools.reduce`` call runs
    ``steps`` of them, as ``torch_steps.counted_steps``), counted by
    callgrind; None where valgrind is not installed or found no ``functools_reduce`` (a
    Python without its symbols)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    environment = reference.snippet_environment()
    environment["PYTHONHASHSEED"] = "0"  # the same dicts' collisions every run
    with tempfile.TemporaryDirectory(prefix="cirron-bench-") as directory:
        counts = os.path.join(directory, "callgrind.out")
        subprocess.run(
            [
                valgrind,
                "--tool=callgrind",
                "--collect-atstart=no",
                f"--toggle-collect={_COUNTED}",
                f"--callgrind-out-file={counts}",
                python or sys.executable,
                "-c",
                code,
            ],
            cwd=directory,
            env=environment,
            capture_output=True,
            check=True,
            timeout=1800,
        )
        with open(counts) as lines:
            totals = [line for line in lines if line.startswith(("totals:", "summary:"))]
    counted = int(totals[-1].split()[1]) if totals else 0
    return counted / steps if counted else None
