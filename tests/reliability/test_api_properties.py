"""Promise 6, by property: random API programs on several threads always give a well-formed trace.

Hypothesis draws small programs (scopes opened and closed, point and summary
marks, ``ci.epochs``/``ci.batches`` loops, scopes that raise, ``ci.flush``,
``ci.trace``, scopes left open) for one to three threads, and settings from
roomy to a ring of 8 spans that must drop. Whatever the program, after
``ci.shutdown()``:

- every span ended exactly once: no span id twice in the spool, and every
  span the program opened is accounted for (in the spool, or counted as
  dropped in ``ci.health()``, never both);
- with nothing dropped, every parent is in the spool and the spool holds
  exactly the spans the program opened, plus ``cirron.session``;
- the in-memory tree (``ci.trace``) has every ended span once;
- no thread of cirron died or reported an error.
"""

from __future__ import annotations

import collections
import tempfile
import threading
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import cirron as ci

NAMES = st.sampled_from(["a", "b", "step", "naïve", "x y"])
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.text(max_size=20),
)
OPERATIONS = st.one_of(
    st.tuples(st.just("open"), NAMES),
    st.tuples(st.just("close")),
    st.tuples(st.just("mark"), NAMES, VALUES, st.sampled_from(["point", "summary"])),
    st.tuples(st.just("loop"), st.sampled_from(["epochs", "batches"]), st.integers(0, 12)),
    st.tuples(st.just("raise"), NAMES),
    st.tuples(st.just("flush")),
    st.tuples(st.just("trace"), st.sampled_from(["text", "dict", "json"])),
)
THREAD = st.tuples(st.lists(OPERATIONS, max_size=25), st.booleans())  # (ops, leave scopes open)
MAX_OPEN = 20  # per thread, well under the 64-level limit


def run_thread(operations: list[tuple[Any, ...]], leave_open: bool, opened: list[int]) -> None:
    """Run one thread's program; ``opened`` gets the number of spans it opened."""
    stack: list[Any] = []
    count = 0
    for operation in operations:
        kind = operation[0]
        if kind == "open" and len(stack) < MAX_OPEN:
            scope = ci.scope(operation[1])
            scope.__enter__()
            stack.append(scope)
            count += 1
        elif kind == "close" and stack:
            stack.pop().__exit__(None, None, None)
        elif kind == "mark":
            ci.mark(operation[1], operation[2], kind=operation[3])
        elif kind == "loop":
            wrapper = ci.epochs if operation[1] == "epochs" else ci.batches
            for item in wrapper(range(operation[2])):
                ci.mark("item", item)
                count += 1
        elif kind == "raise":
            try:
                with ci.scope(operation[1]):
                    raise ValueError("inside a scope")
            except ValueError:
                pass
            count += 1
        elif kind == "flush":
            ci.flush(timeout=5)
        elif kind == "trace":
            ci.trace(format=operation[1], last=3)
    if not leave_open:
        while stack:
            stack.pop().__exit__(None, None, None)
    opened.append(count)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    threads=st.lists(THREAD, min_size=1, max_size=3),
    buffer_size=st.sampled_from([8, 64, 16384]),
    flush_interval=st.sampled_from([0.001, 0.02, 5.0]),
)
def test_random_programs_on_threads_give_a_well_formed_trace(threads, buffer_size, flush_interval):
    with tempfile.TemporaryDirectory() as directory:
        handle = ci.profile(
            path=directory,
            flush_interval=flush_interval,
            frameworks=[],
            config={"buffer_size": buffer_size, "trace_buffer": 100_000},
        )
        opened: list[int] = []
        workers = [
            threading.Thread(target=run_thread, args=(operations, leave_open, opened))
            for operations, leave_open in threads
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        ci.shutdown()
        health = handle.health()
        spans = ci.spool_spans(directory)

    # Every span the program opened ended once (shutdown closes what was left open).
    assert health["spans_started"] == health["spans_ended"] == sum(opened) + 1  # + session
    ids = collections.Counter(span["spanId"] for span in spans)
    assert all(count == 1 for count in ids.values()), "a span was exported twice"
    # Exported or dropped, never both, nothing unaccounted.
    spool = health["sinks"]["spool"]
    assert len(spans) == spool["exported"]
    assert health["spans_exported"] + health["spans_dropped"] == health["spans_ended"]
    assert spool["exported"] + spool["dropped"] == health["spans_exported"]
    event("spans dropped" if health["spans_dropped"] + spool["dropped"] else "nothing dropped")
    event(f"{len(threads)} thread(s)")
    event("up to 10 spans" if health["spans_ended"] <= 10 else "more than 10 spans")
    if health["spans_dropped"] == 0 and spool["dropped"] == 0:
        assert len(spans) == health["spans_ended"]
        for span in spans:
            parent = span.get("parentSpanId")
            assert parent is None or parent in ids, f"{span['name']}: parent missing"
            assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0
    # The in-memory tree holds every ended span once.
    nodes: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node["span_id"])
        for child in node["children"]:
            walk(child)

    walk(ci.trace(format="dict"))
    assert len(nodes) == len(set(nodes)) == health["spans_ended"]
    assert health["export_errors"] == health["threads_restarted"] == health["hook_errors"] == 0
