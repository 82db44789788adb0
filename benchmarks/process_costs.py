"""Whole-process costs, each measured in a fresh subprocess.

- **Sustained spans**: 200k back-to-back ``ci.scope`` with default settings
  (the spool sink on), total process CPU per span from the first span until
  ``ci.flush()`` returns, so the background encoding and file writes count;
  plus the spans dropped. Baseline: the stock SDK with its
  ``BatchSpanProcessor`` and the official OTLP protobuf encoder.
- **Memory**: peak RSS growth over 1M scopes, each with a mark, with the
  default buffers. Baseline: the same loop without cirron.
- **Start-up**: what ``import cirron; ci.profile()`` adds to a script that
  has imported torch, in wall time and RSS, and which heavy modules it
  imported (it must import none). Baseline: the script's own ``import torch``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HEAVY = ("tensorflow", "keras", "transformers", "jax", "pandas")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rss_kb() -> int:
    return _status_kb("VmRSS")


def _peak_rss_kb() -> int:
    # Not getrusage: its maxrss survives exec, so a child reports its parent's peak.
    return _status_kb("VmHWM")


# -- what runs in the child ------------------------------------------------------------
def _dropped(health: dict[str, Any]) -> int:
    """Spans lost anywhere: the ring, or a sink's queue."""
    sinks = health.get("sinks", {}).values()
    return int(health["spans_dropped"]) + sum(int(sink["dropped"]) for sink in sinks)


def _sustained(n: int) -> dict[str, Any]:
    import cirron as ci

    ci.profile(frameworks=[])
    started = time.process_time()
    for _ in range(n):
        with ci.scope("x"):
            pass
    ci.flush()
    cpu = time.process_time() - started
    health = ci.health()
    ci.shutdown()
    return {"ns": cpu / n * 1e9, "dropped": _dropped(health)}


def _sustained_sdk(n: int) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    exported = [0]

    class Encoding(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            encode_spans(spans).SerializeToString()
            exported[0] += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Encoding()))
    tracer = provider.get_tracer("bench")
    started = time.process_time()
    for _ in range(n):
        with tracer.start_as_current_span("x"):
            pass
    provider.force_flush()
    cpu = time.process_time() - started
    provider.shutdown()
    return {"ns": cpu / n * 1e9, "dropped": n - exported[0]}


def _memory(n: int, profiled: bool) -> dict[str, Any]:
    import cirron as ci

    if profiled:
        ci.profile(frameworks=[])
    else:
        ci.profile(enabled=False)
    before = _rss_kb()
    for i in range(n):
        with ci.scope("x"):
            ci.mark("loss", i * 0.5)
    peak = _peak_rss_kb()
    dropped = _dropped(ci.health()) if profiled else 0
    ci.shutdown()
    return {"mb": max(0, peak - before) / 1024, "dropped": dropped}


def _startup(profiled: bool) -> dict[str, Any]:
    before_import = _rss_kb()
    started = time.perf_counter()
    import torch  # noqa: F401 - the user's script

    torch_s = time.perf_counter() - started
    torch_mb = (_rss_kb() - before_import) / 1024
    if not profiled:
        return {"s": torch_s, "mb": torch_mb}
    before = _rss_kb()
    started = time.perf_counter()
    import cirron as ci

    ci.profile()
    seconds = time.perf_counter() - started
    heavy = sorted(name for name in _HEAVY if name in sys.modules)
    return {"s": seconds, "mb": (_rss_kb() - before) / 1024, "heavy": heavy}


def _child(kind: str, n: int) -> None:
    sys.path.insert(0, os.path.join(_ROOT, "src"))
    result = {
        "sustained": lambda: _sustained(n),
        "sustained_sdk": lambda: _sustained_sdk(n),
        "memory": lambda: _memory(n, profiled=True),
        "memory_bare": lambda: _memory(n, profiled=False),
        "startup": lambda: _startup(profiled=True),
        "startup_bare": lambda: _startup(profiled=False),
    }[kind]()
    print("RESULT " + json.dumps(result))


# -- the parent ------------------------------------------------------------------------
def _in_child(kind: str, n: int = 0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:  # the spool lands here
        environment = {**os.environ, "PYTHONPATH": _ROOT, "OMP_NUM_THREADS": "1"}
        environment = {k: v for k, v in environment.items() if not k.startswith("CIRRON_")}
        output = subprocess.run(
            [sys.executable, "-m", "benchmarks.process_costs", kind, str(n)],
            cwd=directory,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        ).stdout
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))  # type: ignore[no-any-return]


def _median_of(kind: str, n: int, runs: int, key: str) -> tuple[float, list[dict[str, Any]]]:
    results = [_in_child(kind, n) for _ in range(runs)]
    values = sorted(result[key] for result in results)
    return values[len(values) // 2], results


def run(quick: bool = False) -> list[tuple[str, float, str, float, str]]:
    """Rows of (operation, ours, baseline name, baseline, unit)."""
    spans, memory_n, runs = (20_000, 50_000, 1) if quick else (200_000, 1_000_000, 3)
    ours, sustained = _median_of("sustained", spans, runs, "ns")
    sdk, sdk_runs = _median_of("sustained_sdk", spans, runs, "ns")
    dropped = max(result["dropped"] for result in sustained)
    sdk_dropped = max(result["dropped"] for result in sdk_runs)
    memory, memory_runs = _median_of("memory", memory_n, runs, "mb")
    memory_dropped = max(result["dropped"] for result in memory_runs)
    memory_bare, _ = _median_of("memory_bare", memory_n, runs, "mb")
    startup, startups = _median_of("startup", 0, runs, "s")
    torch_s, torch_runs = _median_of("startup_bare", 0, runs, "s")
    startup_mb = sorted(result["mb"] for result in startups)[len(startups) // 2]
    torch_mb = sorted(result["mb"] for result in torch_runs)[len(torch_runs) // 2]
    heavy = sorted({name for result in startups for name in result["heavy"]})
    return [
        (
            f"sustained span, spool ({dropped} dropped)",
            ours,
            f"SDK batch + OTLP proto ({sdk_dropped} dropped)",
            sdk,
            "us",
        ),
        (
            f"peak RSS, {memory_n:,} scope+mark ({memory_dropped} dropped)",
            memory,
            "same loop, cirron disabled",
            memory_bare,
            "MB",
        ),
        (
            "ci.profile() after torch" + (f" (imported {', '.join(heavy)}!)" if heavy else ""),
            startup,
            "import torch",
            torch_s,
            "s",
        ),
        ("  its RSS", startup_mb, "import torch", torch_mb, "MB"),
    ]


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
