#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: a virtualenv in .venv with the package
# (editable), the test tools and the frameworks, pinned by constraints.txt.
# Re-runs are fast: nothing is reinstalled while pyproject.toml and
# constraints.txt are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.cirron-setup"
wanted=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$VENV/bin/python" ]; then
    exit 0
fi

echo "setting up $VENV (first run takes a few minutes) ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# torch first and alone: the pinned CPU wheel; an unpinned torch would pull CUDA.
"${pip[@]}" install -c constraints.txt "torch==2.13.0"
"${pip[@]}" install -c constraints.txt -e ".[test]"
echo "$wanted" > "$stamp"
