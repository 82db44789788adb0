#!/usr/bin/env bash
# A virtualenv in .venv-ref with the reference SDK (PyPI `cirron-sdk`), for the benchmarks'
# side-by-side rows. It has the same import name (`cirron`) as this package, so it never shares
# a venv with it; benchmarks/reference.py runs it in a subprocess. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${REFERENCE_VENV:-.venv-ref}
wanted="cirron-sdk==0.3.0 torch==2.13.0"
stamp="$VENV/.cirron-reference"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$VENV/bin/python" ]; then
    exit 0
fi
echo "setting up $VENV with the reference SDK ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# The same CPU torch as .venv, so both sides measure the same tensors on the same build.
"${pip[@]}" install -c constraints.txt "torch==2.13.0"
"${pip[@]}" install "cirron-sdk==0.3.0"
echo "$wanted" > "$stamp"
