#!/usr/bin/env bash
# Two virtualenvs with the peer tools the benchmark's "peers" rows compare with, each beside the
# same CPU torch as .venv: .venv-traceml (TraceML, PyPI `traceml-ai`) and .venv-onelogger
# (NVIDIA's one-logger training telemetry with its OpenTelemetry exporter). benchmarks/peers.py
# runs the same MLP step under each in a subprocess. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

make_venv() {  # make_venv DIR REQUIREMENT...: torch first (pinned by constraints.txt), then the peer
    local venv=$1
    shift
    local wanted="torch==2.13.0 numpy $*"
    local stamp="$venv/.cirron-peer"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$venv/bin/python" ]; then
        return 0
    fi
    echo "setting up $venv ($*) ..." >&2
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
    # The CPU wheel (an unpinned torch would pull the CUDA build and its gigabytes), and numpy
    # at .venv's version: torch warns and loses its numpy bridge without it.
    "${pip[@]}" install -c constraints.txt "torch==2.13.0" numpy
    "${pip[@]}" install "$@"
    echo "$wanted" > "$stamp"
}

make_venv .venv-traceml "traceml-ai==0.5.0"
# nv-one-logger-core 2.3.1 imports yaml without declaring PyYAML: pinned here.
make_venv .venv-onelogger "nv-one-logger-training-telemetry==2.3.1" "nv-one-logger-otel==2.3.1" \
    "PyYAML==6.0.3"
