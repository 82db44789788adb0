#!/usr/bin/env bash
# A virtualenv in .venv-phoenix with Arize Phoenix (PyPI `arize-phoenix`), the LLM-aware trace
# backend tests/test_inference_backends.py sends inference spans to (it skips when Phoenix is
# missing). Not in .venv: Phoenix needs python-dateutil<3, and constraints.txt pins 4.0.0 for the
# rest. Its version is the one constraints.txt pins. About a minute and 850 MB; idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${PHOENIX_VENV:-.venv-phoenix}
wanted=$(grep -E '^arize-phoenix==' constraints.txt)
stamp="$VENV/.cirron-phoenix"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$VENV/bin/phoenix" ]; then
    exit 0
fi
echo "setting up $VENV with $wanted ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "$wanted"
echo "$wanted" > "$stamp"
