#!/usr/bin/env bash
# The main job: a small torch training run, profiled, printing its trace tree.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/python examples/train_torch.py "$@"
