#!/usr/bin/env bash
# Two virtualenvs with TensorFlow and transformers installed beside torch, for the benchmark's
# start-up rows "with TF + HF installed": .venv-frameworks (this package, editable) and
# .venv-ref-frameworks (the reference SDK). That is where an SDK that imports every framework it
# finds pays for it. About 1.5 GB on disk; benchmarks/reference.py finds them (or
# $CIRRON_FRAMEWORKS_PYTHON / $CIRRON_REFERENCE_FRAMEWORKS_PYTHON). Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# Benchmark-time pins; the tests do not use these frameworks yet.
frameworks="tensorflow-cpu==2.21.0 transformers==4.57.6"

make_venv() {  # make_venv DIR WHAT...: torch, the frameworks, then WHAT
    local venv=$1
    shift
    local wanted="$* $frameworks"
    if [ -f "$venv/.cirron-frameworks" ] && [ "$(cat "$venv/.cirron-frameworks")" = "$wanted" ]; then
        return 0
    fi
    echo "setting up $venv ($wanted) ..." >&2
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
    "${pip[@]}" install -c constraints.txt "torch==2.13.0"
    # shellcheck disable=SC2086 # word splitting intended: a list of requirements
    "${pip[@]}" install $frameworks
    "${pip[@]}" install "$@"
    echo "$wanted" > "$venv/.cirron-frameworks"
}

make_venv .venv-frameworks -e .
make_venv .venv-ref-frameworks cirron-sdk==0.3.0
