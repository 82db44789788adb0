"""Cost per operation on the calling thread: scope, mark, loop wrapper, disabled scope.

Every case runs ``n`` operations per round; rounds of all cases are
interleaved so drift hits them alike. The figure is the median over rounds of
calling-thread CPU time per operation, minus the same loop doing nothing.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import cirron as ci

Case = Callable[[int], None]


class _NoOpExporter(SpanExporter):
    def export(self, spans):  # type: ignore[no-untyped-def]
        return SpanExportResult.SUCCESS


def _bare(n: int) -> None:
    for _ in range(n):
        pass


def _stock_sdk_case() -> Case:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_NoOpExporter()))
    tracer = provider.get_tracer("bench")

    def run(n: int) -> None:
        for _ in range(n):
            with tracer.start_as_current_span("x"):
                pass

    return run


def _stock_event_case() -> Case:
    provider = TracerProvider()
    tracer = provider.get_tracer("bench")
    span = tracer.start_span("x")

    def run(n: int) -> None:
        add = span.add_event
        for _ in range(n):
            add("loss", {"value": 0.5})

    return run


def _scope(n: int) -> None:
    scope = ci.scope
    for _ in range(n):
        with scope("x"):
            pass


def _mark(n: int) -> None:
    mark = ci.mark
    with ci.scope("marks"):
        for _ in range(n):
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
    return samples


def run(quick: bool = False) -> list[tuple[str, float, str, float]]:
    """Rows of (operation, ours in ns, baseline name, baseline in ns)."""
    n, rounds = (2_000, 3) if quick else (20_000, 9)
    with tempfile.TemporaryDirectory() as directory:
        ci.shutdown()
        ci.profile(output="none", path=directory, frameworks=[], config={"max_events": 10**6})
        enabled = _rounds(
            {
                "bare": _bare,
                "scope": _scope,
                "mark": _mark,
                "batches": _batches,
                "sdk_span": _stock_sdk_case(),
                "sdk_event": _stock_event_case(),
            },
            n,
            rounds,
        )
        ci.shutdown()
        ci.profile(enabled=False)
        disabled = _rounds({"bare": _bare, "scope": _scope}, n, rounds)
        ci.shutdown()

    def median(samples: dict[str, list[float]], name: str) -> float:
        bare = statistics.median(samples["bare"])
        return max(0.0, statistics.median(samples[name]) - bare)

    return [
        (
            "empty ci.scope",
            median(enabled, "scope"),
            "SDK start_as_current_span",
            median(enabled, "sdk_span"),
        ),
        ("ci.mark point", median(enabled, "mark"), "SDK add_event", median(enabled, "sdk_event")),
        (
            "ci.batches per item",
            median(enabled, "batches"),
            "SDK start_as_current_span",
            median(enabled, "sdk_span"),
        ),
        (
            "disabled ci.scope",
            median(disabled, "scope"),
            "SDK start_as_current_span",
            median(enabled, "sdk_span"),
        ),
    ]
