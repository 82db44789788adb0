"""What a ``collective`` span costs the calling thread (target: at most 5 us a collective).

In a fresh process, a one-rank gloo group (a ``HashStore``: no network), rounds of each case
alternating, the figure the median over rounds of the calling thread's CPU time:

- **A call of the program's**: ``dist.all_reduce`` of a one-element tensor under
  ``ci.profile(output="none", frameworks=["torch"])``, less the same calls with no profiler
  (a profiler started and shut down around each profiled round, untimed), per call.
- **A DDP bucket's span**: a backward of a DDP model of 8 linear layers with one bucket each
  (``bucket_cap_mb`` tiny) under the profiler, cirron's hook reducing the buckets, less the
  same backward, under the same profiler, of a DDP model whose reduction is the same as a
  plain Python hook (no bucket spans, the same forward and backward spans), per bucket. The
  bucket's span ends in the future's callback, which runs on the backend's thread once
  the ranks have reduced; a one-rank group has at once, and that thread's time is not
  counted.
- **DDP's reduction through a Python hook**: the plain Python hook against DDP's built-in
  reduction in C++, per bucket, no profiler: what any communication hook costs, cirron's
  included (a bucket of a real model holds 25 MB, and a step has a few).
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from typing import Any

from . import reference
from .table import Row, half_iqr

TARGET_NS = 5000.0
LAYERS = 8


def _group() -> Any:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist


def _calls(n: int) -> int:
    import torch

    dist = _group()
    tensor = torch.ones(1)
    start = time.thread_time_ns()
    for _ in range(n):
        dist.all_reduce(tensor)
    return time.thread_time_ns() - start


def _backwards(model: Any, inputs: Any, n: int) -> int:
    start = time.thread_time_ns()
    for _ in range(n):
        model(inputs).sum().backward()
    return time.thread_time_ns() - start


def _python_reduction(group: Any) -> Any:
    """DDP's reduction as a plain Python hook: what cirron's hook does, without a span."""

    def first(future: Any) -> Any:
        return future.value()[0]

    def reduce(state: Any, bucket: Any) -> Any:
        buffer = bucket.buffer()
        buffer.mul_(1.0 / group.size())
        return group.allreduce([buffer]).get_future().then(first)

    return reduce


def measure(n: int, steps: int, rounds: int) -> dict[str, list[float]]:
    """Per round: ns added per call, per bucket's span, and per bucket by a Python hook."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import cirron as ci

    dist = _group()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    plain = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(LAYERS)))
    inputs = torch.randn(8, 64)
    # Three DDP models alike: DDP's own reduction in C++; a plain Python hook; cirron's hook,
    # registered at its first forward under the profiler.
    builtin = DistributedDataParallel(plain, bucket_cap_mb=0.001)
    python = DistributedDataParallel(plain, bucket_cap_mb=0.001)
    dist._register_comm_hook(python.reducer, None, _python_reduction(python.process_group))
    ours = DistributedDataParallel(plain, bucket_cap_mb=0.001)
    for model in (builtin, python):
        _backwards(model, inputs, 3)
    ci.profile(output="none", frameworks=["torch"])
    _backwards(ours, inputs, 3)
    _backwards(python, inputs, 3)  # seen with a hook of its own: left alone
    ci.shutdown()
    found: dict[str, list[float]] = {"call": [], "bare_call": [], "span": [], "hook": []}
    buckets = steps * LAYERS
    for round_number in range(rounds):
        bare = {
            "call": _calls(n),
            "builtin": _backwards(builtin, inputs, steps),
            "python": _backwards(python, inputs, steps),
        }
        ci.profile(output="none", frameworks=["torch"])
        _calls(100)  # warm
        profiled = {"call": _calls(n)}
        for name in ("ours", "python")[:: 1 if round_number % 2 else -1]:  # turn about
            profiled[name] = _backwards(ours if name == "ours" else python, inputs, steps)
        ci.shutdown()
        found["call"].append((profiled["call"] - bare["call"]) / n)
        found["bare_call"].append(bare["call"] / n)
        found["span"].append((profiled["ours"] - profiled["python"]) / buckets)
        found["hook"].append((bare["python"] - bare["builtin"]) / buckets)
    return found


def run(quick: bool = False) -> list[Row]:
    if importlib.util.find_spec("torch") is None:
        raise ImportError("the collective rows need torch")
    n, steps, rounds = (2_000, 20, 3) if quick else (20_000, 200, 9)
    found = reference.run_snippet(
        reference.call_snippet("collectives", "measure", n=n, steps=steps, rounds=rounds)
    )
    bare_call = statistics.median(found["bare_call"]) / 1e3
    return [
        Row(
            "collective span, dist.all_reduce",
            statistics.median(found["call"]),
            "target",
            TARGET_NS,
            "us",
            spread=half_iqr(found["call"]),
            note="the calling thread's CPU added per call of a one-element all_reduce on a "
            f"one-rank gloo group (the call itself: {bare_call:.1f} us)",
        ),
        Row(
            "collective span, a DDP bucket",
            statistics.median(found["span"]),
            "target",
            TARGET_NS,
            "us",
            spread=half_iqr(found["span"]),
            note="cirron's hook against the same reduction as a plain Python hook, per bucket; "
            "the backward's own spans left out",
        ),
        Row(
            "  DDP's reduction as a Python hook",
            statistics.median(found["hook"]),
            "",
            None,
            "us",
            spread=half_iqr(found["hook"]),
            note="a Python communication hook (any, cirron's included) against DDP's built-in "
            "C++ reduction, per bucket of a one-rank group (no profiler)",
        ),
    ]
