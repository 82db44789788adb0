#!/usr/bin/env bash
# Idempotent set-up of a fresh machine: a virtualenv in .venv with the package (editable),
# pinned by constraints.txt.
#   bash scripts/setup.sh demo   torch, NumPy, plotly and the package: what the demo and the
#                                commands it suggests need
#   bash scripts/setup.sh        everything the tests need (test tools, transformers, ...)
# Re-runs are fast: nothing is reinstalled while pyproject.toml, constraints.txt and this
# script are unchanged (a full set-up also serves the demo).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
profile=${1:-test}
# setup.py and the C file: a changed extension is built again (the editable install holds it).
wanted=$(cat pyproject.toml setup.py src/cirron/recording/_hot.c constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
done_for() { [ -f "$VENV/.cirron-setup-$1" ] && [ "$(cat "$VENV/.cirron-setup-$1")" = "$wanted" ]; }

if [ -x "$VENV/bin/python" ] && { done_for test || { [ "$profile" = demo ] && done_for demo; }; }; then
    exit 0
fi

echo "setting up $VENV for the $profile (the first run takes a few minutes) ..." >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# torch first and alone: the pinned CPU wheel; an unpinned torch would pull CUDA.
"${pip[@]}" install -c constraints.txt "torch==2.13.0"
if [ "$profile" = demo ]; then
    # NumPy with torch (torch warns at import without it) and the report's plotting library.
    "${pip[@]}" install -c constraints.txt -e ".[torch,report]"
else
    "${pip[@]}" install -c constraints.txt -e ".[test]"
fi
if [ "$profile" != demo ] && ! command -v chromium >/dev/null 2>&1; then
    # The report's test opens it in a real browser: Debian's chromium (these machines run as
    # root; elsewhere, install it yourself and the test finds it).
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing chromium for the browser test ..." >&2
        { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } ||
            echo "could not install chromium: the browser test will be skipped" >&2
    fi
fi
if [ "$profile" != demo ]; then
    # Arize Phoenix, the LLM-aware backend of the inference test, in a venv of its own (its
    # dependencies clash with the frameworks'); idempotent, about a minute the first time.
    bash scripts/phoenix-venv.sh || echo "could not set up Phoenix: its test will be skipped" >&2
fi
echo "$wanted" > "$VENV/.cirron-setup-$profile"
