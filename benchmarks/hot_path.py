"""Cost per operation on the calling thread: scope, mark, loop wrapper, disabled scope.

Every case runs ``n`` operations per round; rounds of all cases are
interleaved so drift hits them alike, and each SDK flushes after every case
(not timed) so that no case runs into a buffer the one before it filled. The
figure is the median over rounds of calling-thread CPU time per operation,
minus the same loop doing nothing.

:func:`measure` runs in fresh processes under this package and under the
reference SDK alike (:func:`benchmarks.reference.call_snippet`), ours and the
reference's alternating; the disabled scope in processes of its own, which
never profiled. The stock OpenTelemetry SDK's cases run beside ours in our
processes (the reference's venv has no OpenTelemetry).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import cirron as ci

from . import reference
from .counted import PURE_PYTHON, instructions_per_step
from .table import Row, half_iqr

Case = Callable[[int], None]
# Marks per scope in the mark case: under both SDKs' limits (ours keeps 10,000 events a
# span, the reference 65,536 marks a thread until a flush), so every mark is recorded.
MARKS_PER_SCOPE = 1000


def _bare(n: int) -> None:
    for _ in range(n):
        pass


def _stock_sdk_cases() -> dict[str, Case]:
    """The stock OpenTelemetry SDK's span and event; none where it is not installed."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError:
        return {}

    class NoOpExporter(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(NoOpExporter()))
    tracer = provider.get_tracer("bench")
    event_span = tracer.start_span("x")

    def sdk_span(n: int) -> None:
        for _ in range(n):
            with tracer.start_as_current_span("x"):
                pass

    def sdk_event(n: int) -> None:
        add = event_span.add_event
        for _ in range(n):
            add("loss", {"value": 0.5})

    return {"sdk_span": sdk_span, "sdk_event": sdk_event}


def _scope(n: int) -> None:
    scope = ci.scope
    for _ in range(n):
        with scope("x"):
            pass


def _mark(n: int) -> None:
    mark = ci.mark
    for _ in range(n // MARKS_PER_SCOPE):
        with ci.scope("marks"):
            for _ in range(MARKS_PER_SCOPE):
                mark("loss", 0.5)


def _batches(n: int) -> None:
    for _ in ci.batches(range(n)):
        pass


def _measure(case: Case, n: int) -> float:
    started = time.thread_time_ns()
    case(n)
    return (time.thread_time_ns() - started) / n


def _rounds(cases: dict[str, Case], n: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            samples[name].append(_measure(case, n))
            # Not timed: each case begins with an empty span buffer. A round of 10,000 spans
            # from one case and then another's would fill the buffer (8,192 spans) and time
            # the wait for the flush thread, not the operation.
            ci.flush()
    return samples


def measure(n: int, rounds: int, enabled: bool) -> dict[str, Any]:
    """ns per operation per round for each case, and what the SDK dropped meanwhile.

    Runs in a fresh subprocess, under whichever ``cirron`` the interpreter
    has; ``enabled=False`` measures a process that profiles with
    ``ci.profile(enabled=False)`` from the start, as a user would run it.
    """
    if not enabled:
        ci.profile(enabled=False)
        samples = _rounds({"bare": _bare, "disabled": _scope}, n, rounds)
        ci.shutdown()
        return {"samples": samples, "dropped": {"spans": 0, "marks": 0}}
    ci.profile(output="none", frameworks=[])
    cases = {"bare": _bare, "scope": _scope, "mark": _mark, "batches": _batches}
    samples = _rounds({**cases, **_stock_sdk_cases()}, n, rounds)
    dropped = reference.dropped(ci.health())
    ci.shutdown()
    return {"samples": samples, "dropped": dropped}


def counted(case: str, n: int) -> dict[str, int]:
    """``n`` operations of ``case`` (``scope``, ``mark``, ``batches``, or ``bare``: the loop
    alone) inside ``functools.reduce``, the one call whose instructions callgrind counts, after
    200 not counted, with the collector off. Metrics off and no sink: the calling thread's
    work only (the sustained cost is measured by ``process_costs``). Under this package."""
    import functools
    import gc

    ci.profile(output="none", frameworks=[], metrics=False)
    scope, mark = ci.scope, ci.mark
    batches = iter(ci.batches(range(n + 200)))

    def one_scope(_: Any, __: Any) -> None:
        with scope("x"):
            pass

    def one_mark(_: Any, __: Any) -> None:
        mark("loss", 0.5)

    def one_batch(_: Any, __: Any) -> None:
        next(batches)

    def nothing(_: Any, __: Any) -> None:
        pass

    operation = {"scope": one_scope, "mark": one_mark, "batches": one_batch, "bare": nothing}
    with ci.scope("marks"):  # (the marks' scope; the other cases nest under it alike)
        for _ in range(200):
            operation[case](None, None)
        ci.flush()
        gc.collect()
        gc.disable()
        functools.reduce(operation[case], range(n), None)
        gc.enable()
    ci.shutdown()
    return {"n": n}


def instructions(n: int) -> dict[str, float | None]:
    """Instructions per operation, the empty loop's taken off: compiled and pure-Python
    twins; None where valgrind is missing."""
    counts: dict[str, float | None] = {}
    for case in ("bare", "scope", "mark", "batches"):
        code = reference.call_snippet("hot_path", "counted", case=case, n=n)
        counts[case] = instructions_per_step(code, n)
        counts["pure " + case] = instructions_per_step(PURE_PYTHON + code, n)
    figures: dict[str, float | None] = {}
    for case in ("scope", "mark", "batches"):
        for path in ("", "pure "):
            value, bare = counts[path + case], counts[path + "bare"]
            figures[path + case] = value - bare if value is not None and bare is not None else None
    return figures


def _figures(*kinds: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float], int]:
    """Median over every round of every process, the empty loop's subtracted; spreads; lost.

    Each kind is the results of the processes of one kind (enabled, disabled);
    its cases lose the empty loop measured in the same processes.
    """
    figures: dict[str, float] = {}
    spreads: dict[str, float] = {}
    lost = 0
    for results in kinds:
        samples: dict[str, list[float]] = {}
        for result in results:
            for name, values in result["samples"].items():
                samples.setdefault(name, []).extend(values)
            lost += result["dropped"]["spans"] + result["dropped"]["marks"]
        bare = statistics.median(samples.pop("bare"))
        for name, values in samples.items():
            figures[name] = max(0.0, statistics.median(values) - bare)
            spreads[name] = half_iqr(values) or 0.0
    return figures, spreads, lost


def run(quick: bool = False) -> list[Row]:
    """Rows for the four operations: ours, the stock SDK's, the reference SDK's."""
    # Full: 15 rounds per SDK, in 3 processes each (3 more for the disabled scope), ours and
    # the reference's alternating.
    n, rounds, runs = (2_000, 2, 1) if quick else (10_000, 5, 3)
    code = reference.call_snippet("hot_path", "measure", n=n, rounds=rounds, enabled=True)
    ours_on, theirs_on = reference.run_both(code, runs)
    code = reference.call_snippet("hot_path", "measure", n=n, rounds=rounds, enabled=False)
    ours_off, theirs_off = reference.run_both(code, runs)
    ours, spread, ours_lost = _figures(ours_on, ours_off)
    theirs, _, theirs_lost = (
        _figures(theirs_on, theirs_off) if theirs_on and theirs_off else ({}, {}, 0)
    )
    if quick:  # the snippet runs (a renamed entry point fails here), not counted: minutes
        reference.run_snippet(reference.call_snippet("hot_path", "counted", case="scope", n=5))
        counted_ops: dict[str, float | None] = {}
    else:
        counted_ops = instructions(2_000)
    lost = f" ({ours_lost} lost)" if ours_lost else ""
    lost += f" (reference lost {theirs_lost})" if theirs_lost else ""
    span, event = "SDK start_as_current_span", "SDK add_event"
    return [
        Row(
            "empty ci.scope" + lost,
            ours["scope"],
            span,
            ours["sdk_span"],
            "us",
            theirs.get("scope"),
            spread=spread["scope"],
        ),
        Row(
            "ci.mark point",
            ours["mark"],
            event,
            ours["sdk_event"],
            "us",
            theirs.get("mark"),
            spread=spread["mark"],
        ),
        Row(
            "ci.batches per item",
            ours["batches"],
            span,
            ours["sdk_span"],
            "us",
            theirs.get("batches"),
            spread=spread["batches"],
        ),
        Row(
            "disabled ci.scope",
            ours["disabled"],
            span,
            ours["sdk_span"],
            "us",
            theirs.get("disabled"),
            spread=spread["disabled"],
        ),
        *_instruction_rows(counted_ops),
    ]


def _instruction_rows(counted_ops: dict[str, float | None]) -> list[Row]:
    """Instructions per operation, compiled and pure Python, where callgrind counted them."""
    rows = []
    for case, name in (
        ("scope", "empty ci.scope"),
        ("mark", "ci.mark point"),
        ("batches", "ci.batches per item"),
    ):
        compiled, pure = counted_ops.get(case), counted_ops.get("pure " + case)
        if compiled is None or pure is None:
            continue
        rows.append(
            Row(
                f"instructions per {name}",
                compiled / 1000,
                "pure-Python twins",
                pure / 1000,
                "k",
                note=""
                if rows
                else "counted by valgrind's callgrind on the calling thread, 2,000 "
                "operations, metrics off, the empty loop's taken off: within a few hundred from "
                "run to run, where the timed rows above vary by a microsecond",
            )
        )
    return rows
