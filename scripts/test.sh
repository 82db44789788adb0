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
# Two processes (pytest-xdist), a test file each at a time: a file's shared fixtures (a training
# run, a receiver, a torchrun) are set up once; most tests wait on a subprocess or a server.
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
