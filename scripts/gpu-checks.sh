#!/usr/bin/env bash
# The checks that need a CUDA GPU, run on a machine that has one (and PyTorch, as its own
# python3; no venv): the CUDA paths of the tests (GPU time, per-step CUDA peaks, snapshots of
# GPU tensors, hw.gpu.* metrics, an NCCL collective's span) and what the per-step CUDA probe costs.
#   bash scripts/gpu-checks.sh            (wheels of the OpenTelemetry packages in .whl/, if
#                                          that python3 lacks them: they are installed first)
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$PWD/tests
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 - <<'PY'
import time

import torch

from cirron.instrumentors import torch_memory

torch_memory.CUDA[0] = torch.cuda  # as the torch instrumentor sets them
torch_memory.RAW_STATS[0] = getattr(torch._C, "_cuda_memoryStats", None)
torch.zeros(1, device="cuda")
print("torch", torch.__version__)
for name, call in (
    ("cuda_peaks() (read both peaks, reset)", torch_memory.cuda_peaks),
    ("torch.cuda.memory_stats(device)", lambda: torch.cuda.memory_stats(0)),
    ("torch.cuda.reset_peak_memory_stats(device)", lambda: torch.cuda.reset_peak_memory_stats(0)),
):
    for _ in range(200):
        call()
    count, started = 5000, time.perf_counter()
    for _ in range(count):
        call()
    print(f"{name}: {(time.perf_counter() - started) / count * 1e6:.1f} us a call")
PY
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_time.py tests/test_step_resources.py \
    tests/test_snapshots.py tests/test_metrics.py tests/test_collectives.py \
    -k "gpu or cuda or GPU" 2>&1
