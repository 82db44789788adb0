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
# Bytecode for the package's modules, once: each test's subprocess then loads it instead of
# compiling every module (a machine with PYTHONDONTWRITEBYTECODE=1 writes none by itself).
.venv/bin/python -m compileall -q src/cirron
# Two processes (pytest-xdist), a test file each at a time: a file's shared fixtures (a training
# run, a receiver, a torchrun) are set up once; most tests wait on a subprocess or a server.
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
# The torch hooks, scopes, marks and loops once more on their pure-Python twins, which a platform
# without the compiled helper runs (src/cirron/recording/hot.py); the run above used the
# compiled ones where they are built. A test at a time to either process (these files share
# no costly fixture; test_torch.py alone would keep one process busy to the end).
if [ $# -eq 0 ]; then
    CIRRON_PURE_PYTHON=1 .venv/bin/python -m pytest -q -n 2 --dist load tests/test_torch.py \
        tests/test_scope.py tests/test_mark.py tests/test_loops.py
fi
