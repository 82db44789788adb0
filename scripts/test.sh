#!/usr/bin/env bash
# The whole test suite: lint, format check, types, then every test (slow ones included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks examples
.venv/bin/ruff format --check src tests benchmarks examples
.venv/bin/mypy
exec .venv/bin/python -m pytest -q "$@"
