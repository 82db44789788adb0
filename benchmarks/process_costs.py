"""Whole-process costs, each measured in a fresh subprocess, ours and the reference SDK's.

- **Sustained spans**: 200k back-to-back ``ci.scope`` with default settings
  (the spool sink on), total process CPU per span from the first span until
  ``ci.flush()`` returns, so the background encoding and file writes count;
  plus the spans dropped, and the CPU per span kept (an SDK that drops a
  span does not encode or write it). Baseline: the stock SDK with its
  ``BatchSpanProcessor`` and the official OTLP protobuf encoder. Once more
  with the spool's gzip by zlib, as where the ``speedups`` extra is not
  installed (ISA-L writes it where it is).
- **Memory**: peak RSS growth over 1M scopes, each with a mark, with the
  default buffers (one run each). Baseline: the same loop with
  ``ci.profile(enabled=False)``.
- **Start-up**: what ``import cirron; ci.profile()`` adds to a script that
  has imported torch, in wall time and RSS, and which heavy modules it
  imported (it must import none). Baseline: the script's own ``import torch``.

The functions under "what runs in the subprocess" run under this package or the
reference SDK alike (:func:`benchmarks.reference.call_snippet`); the runs of
ours and the reference's alternate. The stock SDK runs under our interpreter
only (the reference's venv has no OpenTelemetry).
"""

from __future__ import annotations

import compileall
import gc
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from . import reference
from .table import Row, half_iqr

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


# -- what runs in the subprocess ------------------------------------------------------
def sustained(n: int, zlib: bool = False) -> dict[str, Any]:
    import cirron as ci

    if zlib:  # as where the speedups extra (ISA-L) is not installed
        from cirron.exporters import deflate

        deflate._isal = None
    ci.profile(frameworks=[])
    started = time.process_time()
    for _ in range(n):
        with ci.scope("x"):
            pass
    ci.flush()
    cpu = time.process_time() - started
    dropped = reference.dropped(ci.health())
    ci.shutdown()
    kept = max(1, n - dropped["spans"])
    return {
        "ns": cpu / n * 1e9,
        "ns_kept": cpu / kept * 1e9,
        "dropped": 100 * dropped["spans"] / n,
        "files": dropped["files"],
    }


def sustained_sdk(n: int) -> dict[str, Any]:
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
    kept = max(1, exported[0])
    return {"ns": cpu / n * 1e9, "ns_kept": cpu / kept * 1e9, "dropped": 100 * (n - kept) / n}


def memory(n: int, profiled: bool) -> dict[str, Any]:
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
    dropped = reference.dropped(ci.health()) if profiled else {"spans": 0, "marks": 0}
    ci.shutdown()
    lost = 100 * (dropped["spans"] + dropped["marks"]) / (2 * n)
    return {"mb": max(0, peak - before) / 1024, "dropped": lost}


def startup(profiled: bool) -> dict[str, Any]:
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads its OpenMP runtime
    _compiled_as_installed("cirron")
    before_import = _rss_kb()
    started = time.perf_counter()
    import torch  # noqa: F401 - the user's script

    torch_s = time.perf_counter() - started
    torch_mb = (_rss_kb() - before_import) / 1024
    if not profiled:
        return {"s": torch_s, "mb": torch_mb}
    # The full pass over torch's objects that its import left due, paid as the script's
    # next statements would pay it (else the first few thousand allocations of cirron's
    # start-up run it, and the row measures torch's collector: 0.1-0.25 s here).
    gc.collect()
    before = _rss_kb()
    collecting = CollectorTime()
    gc.callbacks.append(collecting)
    started = time.perf_counter()
    import cirron as ci

    ci.profile()
    seconds = time.perf_counter() - started
    gc.callbacks.remove(collecting)
    heavy = sorted(name for name in _HEAVY if name in sys.modules)
    return {
        "s": seconds,
        "gc_s": collecting.seconds,
        "mb": (_rss_kb() - before) / 1024,
        "heavy": heavy,
    }


def _compiled_as_installed(package: str) -> None:
    """Bytecode for ``package``, as ``pip install`` of a wheel writes it: an editable install
    under ``PYTHONDONTWRITEBYTECODE=1`` (this machine's) has none, and every process would
    compile each module again (~0.25 s of a start-up)."""
    spec = importlib.util.find_spec(package)
    folders = (spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        compileall.compile_dir(folder, quiet=2)


class CollectorTime:
    """A ``gc.callbacks`` entry adding up the seconds the cyclic collector ran.

    ``import torch`` leaves a full collection due (a few thousand objects more start it),
    so whatever runs next pays for a pass over torch's objects: this says how much of a
    start-up that was.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0  # passes over the oldest generation (every object)
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.full += info.get("generation") == 2


# -- the parent ------------------------------------------------------------------------
Results = list[dict[str, Any]]


def _ours_and_reference(
    function: str,
    runs: int,
    pythons: tuple[str | None, str | None] | None = None,
    **arguments: Any,
) -> tuple[Results, Results]:
    """``runs`` fresh processes each, alternating; no reference results when it is absent."""
    code = reference.call_snippet("process_costs", function, **arguments)
    ours, theirs = reference.run_both(code, runs, pythons)
    return ours, theirs or []


def _ours_only(function: str, runs: int, **arguments: Any) -> Results:
    code = reference.call_snippet("process_costs", function, **arguments)
    return [reference.run_snippet(code) for _ in range(runs)]


def _median(results: Results, key: str) -> float | None:
    return statistics.median(result[key] for result in results) if results else None


def _most(results: Results, key: str) -> float | None:
    return max(result[key] for result in results) if results else None


def _row(
    operation: str,
    key: str,
    unit: str,
    ours: Results,
    baseline: tuple[str, Results],
    theirs: Results,
    most: bool = False,
) -> Row:
    """The median over runs of ``key`` (the largest, for what was dropped)."""
    figure = _most if most else _median
    baseline_name, baseline_results = baseline
    return Row(
        operation,
        figure(ours, key) or 0.0,
        baseline_name,
        figure(baseline_results, key),
        unit,
        figure(theirs, key),
        spread=half_iqr(result[key] for result in ours),
    )


def run(quick: bool = False) -> list[Row]:
    """Sustained spans, peak RSS and start-up: ours, a baseline, the reference's."""
    spans, memory_n, runs = (20_000, 50_000, 1) if quick else (200_000, 1_000_000, 3)
    sustained, sustained_reference = _ours_and_reference("sustained", runs, n=spans)
    sdk = _ours_only("sustained_sdk", runs, n=spans)
    sustained_zlib = _ours_only("sustained", runs, n=spans, zlib=True)
    # Peak RSS barely moves between runs, and the reference's 1M scopes take ~30 s: one run.
    memory, memory_reference = _ours_and_reference("memory", 1, n=memory_n, profiled=True)
    memory_bare = _ours_only("memory", 1, n=memory_n, profiled=False)
    start, start_reference = _ours_and_reference("startup", runs, profiled=True)
    torch_only = _ours_only("startup", runs, profiled=False)

    heavy = sorted({name for result in start for name in result["heavy"]})
    heavy_reference = sorted({name for result in start_reference for name in result["heavy"]})
    startup_name = "ci.profile() after torch"
    if heavy or heavy_reference:
        startup_name += f" (imported {', '.join(heavy) or 'none'}; reference: "
        startup_name += f"{', '.join(heavy_reference) or 'none'})"
    collector = f"of which {_median(start, 'gc_s') or 0.0:.2f} s in the garbage collector"
    if start_reference:
        collector += f" (the reference's {_median(start_reference, 'gc_s') or 0.0:.2f} s)"
    collector += (
        "; the full pass over torch's objects that `import torch` leaves due is paid before the "
        "timer starts, as the script's next lines would pay it, and cirron's modules are "
        "byte-compiled first, as a wheel's install leaves them"
    )
    evicted = sum(result["files"] for result in sustained_reference)
    lost = "  spans dropped" + (f" (reference evicted {evicted} spool files)" if evicted else "")
    sdk_baseline = ("SDK batch + OTLP proto", sdk)
    disabled = ("same loop, cirron disabled", memory_bare)
    torch_baseline = ("import torch", torch_only)
    memory_name = f"peak RSS, {memory_n:,} scope+mark"
    return [
        _row("sustained span, spool", "ns", "us", sustained, sdk_baseline, sustained_reference),
        _row(lost, "dropped", "%", sustained, sdk_baseline, sustained_reference, most=True),
        _row("  CPU per span kept", "ns_kept", "us", sustained, sdk_baseline, sustained_reference),
        _row(
            "  with zlib's gzip (no speedups extra)", "ns", "us", sustained_zlib, sdk_baseline, []
        ),
        _row(memory_name, "mb", "MB", memory, disabled, memory_reference),
        _row("  spans and marks dropped", "dropped", "%", memory, disabled, memory_reference, True),
        replace(
            _row(startup_name, "s", "s", start, torch_baseline, start_reference), note=collector
        ),
        _row("  its RSS", "mb", "MB", start, torch_baseline, start_reference),
    ] + ([] if quick else _startup_with_frameworks(runs))


def _startup_with_frameworks(runs: int) -> list[Row]:
    """The start-up rows again, in venvs that also have TensorFlow and transformers.

    That is where an SDK that imports every framework it finds installed pays
    for it; none of these rows when ``.venv-frameworks`` is missing.
    """
    ours_python, reference_python = reference.frameworks_pythons()
    if ours_python is None:
        return []
    pythons = (ours_python, reference_python)
    ours, theirs = _ours_and_reference("startup", runs, pythons, profiled=True)
    bare = reference.call_snippet("process_costs", "startup", profiled=False)
    torch_only = [reference.run_snippet(bare, ours_python) for _ in range(runs)]
    heavy = sorted({name for result in ours for name in result["heavy"]})
    heavy_reference = sorted({name for result in theirs for name in result["heavy"]})
    imported = f"ci.profile() imported {', '.join(heavy) or 'no framework'}"
    if theirs:
        imported += f", the reference's {', '.join(heavy_reference) or 'none'}"
    baseline = ("import torch", torch_only)
    return [
        replace(_row("  with TF + HF installed", "s", "s", ours, baseline, theirs), note=imported),
        _row("  its RSS", "mb", "MB", ours, baseline, theirs),
    ]
