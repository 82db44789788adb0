"""Telling runs apart in a spool: ``cirron.offline.runs`` on spans made here."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from cirron.offline import runs
from cirron.otel import semconv


def session(trace_id: int, start: int, **resource: object) -> ReadableSpan:
    context = SpanContext(trace_id, trace_id & 0xFFFF or 1, False, TraceFlags(1))
    return ReadableSpan(
        name=semconv.SESSION, context=context, start_time=start, end_time=start + 10,
        resource=Resource(resource),  # type: ignore[arg-type]
    )  # fmt: skip


def test_processes_with_a_run_id_are_one_run_and_the_others_are_runs_of_their_own():
    spans = [
        session(0x9A, 1, **{semconv.RUN_ID: "job", semconv.RANK: 1, semconv.PROCESS_PID: 11}),
        session(0x9A, 2, **{semconv.RUN_ID: "job", semconv.RANK: 0, semconv.PROCESS_PID: 10}),
        session(0x9B, 5, **{semconv.PROCESS_PID: 12}),
    ]
    found = runs.runs_of(spans)
    assert [run.id for run in found] == ["job", format(0x9B, "032x")]
    assert [process.label for process in found[0].processes] == ["rank 0", "rank 1"]


def test_a_number_names_a_run_by_its_place_never_by_an_id_that_begins_with_it():
    spans = [session((0x9A << 120) + n, n, **{semconv.PROCESS_PID: n}) for n in (1, 2)]
    found = runs.runs_of(spans)
    assert all(run.id.startswith("9") for run in found)
    assert runs.pick(found, None) == [found[-1]]
    assert runs.pick(found, "1") == [found[0]] and runs.pick(found, "-1") == [found[1]]
    assert runs.pick(found, "all") == found
    with pytest.raises(LookupError, match="--run '9' names no run"):
        runs.pick(found, "9")
    with pytest.raises(LookupError, match="matches 2 runs"):
        runs.pick(found, "9a")
    assert runs.pick(found, found[0].id) == [found[0]]


def test_the_first_characters_of_an_id_may_all_be_digits():
    # "637083" of "6370833b...": no run's number (there are two), so one run's id prefix.
    spans = [
        session((0x6370833B << 96) + 1, 1, **{semconv.PROCESS_PID: 1}),
        session((0x9A << 120) + 2, 2, **{semconv.PROCESS_PID: 2}),
    ]
    found = runs.runs_of(spans)
    assert runs.pick(found, "637083") == [found[0]]
    assert runs.pick(found, "2") == [found[1]]  # a number is still a number
    with pytest.raises(LookupError, match="--run '6' names no run"):
        runs.pick(found, "6")  # a short one: a run's number mistyped, not an id
