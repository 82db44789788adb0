"""Run a user's training script under ``ci.profile()`` and write its trace tree to a file.

    python traced.py SCRIPT OUT_DIR [ARGS...]

The script runs as ``__main__`` with ``ARGS`` as its command line; once it returns, the
tree ``ci.trace(format="dict")`` gives is written to ``OUT_DIR/<rank>.json`` (``RANK``,
else 0), so that a test can check what the user's code implies against what was recorded.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import cirron as ci

script, out = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
ci.profile(output="none")
runpy.run_path(script, run_name="__main__")
ci.shutdown()
with open(os.path.join(out, f"{os.environ.get('RANK', '0')}.json"), "w") as file:
    json.dump(ci.trace(format="dict"), file)
