#!/usr/bin/env bash
# The whole test suite: lint, format check, types, the docs build, then every test (slow ones
# included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks examples docs/*.py
.venv/bin/ruff format --check src tests benchmarks examples docs/*.py  # not docs/*.md: aligned comments
.venv/bin/mypy
# The documentation site, strictly: a broken link or a warning fails (docs/, mkdocs.yml).
# Not --quiet: it silences the warnings --strict counts, and a broken link then passes.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .site
.venv/bin/python -m pytest -q "$@"
# The torch hooks once more on their pure-Python twin, which a platform without the compiled
# helper runs (src/cirron/hot.py); the run above used the compiled one where it is built.
if [ $# -eq 0 ]; then
    CIRRON_PURE_PYTHON=1 .venv/bin/python -m pytest -q tests/test_torch.py
fi
