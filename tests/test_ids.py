"""Trace and span ids are unique whatever the program does to its random generators.

Training scripts seed everything (``random.seed``, ``transformers.set_seed``,
``lightning.seed_everything``) and some libraries save and restore the global
random state around an evaluation. None of that may repeat an id, and
drawing ids must not change the program's own random numbers.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor

import cirron as ci
from support import run_python

SEEDED_RUN = """
import random, sys
random.seed(42)  # as transformers.set_seed / lightning.seed_everything do
import cirron as ci
ci.profile(path=sys.argv[1] if len(sys.argv) > 1 else ".cirron")
for epoch in ci.epochs(range(2)):
    for batch in ci.batches(range(3)):
        with ci.scope("work"):
            ci.mark("loss", random.random())
"""


def ids_in(path) -> tuple[set[str], list[str]]:
    """(trace ids, span ids) of every span spooled under ``path``."""
    spans = ci.spool_spans(str(path))
    return {span["traceId"] for span in spans}, [span["spanId"] for span in spans]


class SpanIds(SpanProcessor):
    """Collects the span id of every span that ends on the provider."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def on_end(self, span) -> None:
        self.ids.append(span.context.span_id)


def test_two_runs_of_a_seeded_script_share_no_trace_id_and_no_span_id(tmp_path):
    for run in ("first", "second"):
        result = run_python(SEEDED_RUN + "\nci.shutdown()\n", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        (tmp_path / ".cirron").rename(tmp_path / run)
    first_traces, first_spans = ids_in(tmp_path / "first")
    second_traces, second_spans = ids_in(tmp_path / "second")
    assert len(first_traces) == len(second_traces) == 1
    assert first_traces.isdisjoint(second_traces)
    assert len(first_spans) == len(second_spans) == 1 + 2 + 6 + 6  # session, epochs, batches, work
    assert set(first_spans).isdisjoint(second_spans)


def test_restoring_the_random_state_during_a_run_never_reuses_an_id():
    ci.profile()
    saved = random.getstate()
    for _ in range(50):
        with ci.scope("before"):
            pass
    random.setstate(saved)  # a library that isolates its evaluation's randomness
    for _ in range(50):
        with ci.scope("restored"):
            pass
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    for _ in range(50):
        with ci.scope("seeded"):
            pass
    ci.shutdown()
    _traces, spans = ids_in(".cirron")
    assert len(spans) == len(set(spans)) == 151


def test_profiling_leaves_the_programs_random_numbers_as_they_were():
    def draws(profiled: bool) -> list[float]:
        random.seed(7)
        if profiled:
            ci.profile(output="none", snapshots="sampled", sample_rate=0.5)
            ci.watch(torch.nn.Linear(2, 2))
        numbers = []
        for _ in ci.epochs(range(5)):  # snapshot sampling draws at each boundary
            for _ in ci.batches(range(4)):
                with ci.scope("step"):
                    numbers.append(random.random())
        ci.shutdown()
        return numbers

    assert draws(profiled=True) == draws(profiled=False)


def test_a_million_spans_with_reseeding_all_along_have_unique_ids():
    ci.profile(output="none", config={"trace_buffer": 1})
    collected = SpanIds()
    trace.get_tracer_provider().add_span_processor(collected)
    saved = random.getstate()
    for block in range(1000):
        if block % 3 == 0:
            random.seed(1234)
        elif block % 3 == 1:
            random.setstate(saved)
        for _ in range(1000):
            with ci.scope("s"):
                pass
    ci.shutdown()
    assert len(collected.ids) >= 1_000_000
    assert len(set(collected.ids)) == len(collected.ids)


# A program: before each block of spans, something done to a random generator.
ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["seed", "save", "restore", "numpy", "torch", "nothing"]),
        st.integers(0, 3),  # the seed
        st.integers(1, 40),  # spans in the block
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(program=ACTIONS)
def test_no_sequence_of_seeds_and_restores_repeats_an_id(program):
    ci.shutdown()
    ci.profile(output="none")
    collected = SpanIds()
    trace.get_tracer_provider().add_span_processor(collected)
    saved = random.getstate()
    for action, seed, spans in program:
        if action == "seed":
            random.seed(seed)
        elif action == "save":
            saved = random.getstate()
        elif action == "restore":
            random.setstate(saved)
        elif action == "numpy":
            np.random.seed(seed)
        elif action == "torch":
            torch.manual_seed(seed)
        for _ in range(spans):
            with ci.scope("s"):
                pass
    ci.shutdown()
    counts = collections.Counter(collected.ids)
    assert [span_id for span_id, n in counts.items() if n > 1] == []


FORKING_RUN = """
import os, random, sys
import cirron as ci

random.seed(3)
ci.profile()
with ci.scope("parent-before"):
    pass
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:  # a child that seeds like its parent, then profiles on its own
        random.seed(3)
        ci.profile()
        for _ in range(20):
            with ci.scope("child"):
                pass
        ci.shutdown()
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
with ci.scope("parent-after"):
    pass
ci.shutdown()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_children_that_seed_like_their_parent_get_ids_of_their_own(tmp_path):
    result = run_python(FORKING_RUN, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    traces, spans = ids_in(tmp_path / ".cirron")
    assert len(traces) == 4  # the parent's session and each child's
    assert len(spans) == len(set(spans)) == 2 + 1 + 3 * (20 + 1)


def _spawned_child(path: str) -> None:
    random.seed(5)
    ci.profile(path=path)
    for _ in range(20):
        with ci.scope("child"):
            pass
    ci.shutdown()


@pytest.mark.slow
def test_spawned_children_that_seed_alike_get_ids_of_their_own(tmp_path):
    path = str(tmp_path / "spawned")
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=_spawned_child, args=(path,)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    traces, spans = ids_in(path)
    assert len(traces) == 3
    assert len(spans) == len(set(spans)) == 3 * 21


def test_a_providers_own_id_generator_is_honoured(tmp_path):
    result = run_python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator
        import cirron as ci

        class Counting(IdGenerator):  # a user's own generator: ids the user can recognise
            next = 0x1000

            def generate_span_id(self):
                Counting.next += 1
                return Counting.next

            def generate_trace_id(self):
                return 0xABC

        provider = TracerProvider(id_generator=Counting(), shutdown_on_exit=False)
        trace.set_tracer_provider(provider)
        ci.profile(output="none")
        with ci.scope("mine"):
            pass
        (node,) = ci.trace(format="dict", name="mine")
        assert 0x1000 < int(node["span_id"], 16) < 0x1010, node["span_id"]
        assert ci.trace(format="dict")["span_id"] == f"{0x1001:016x}"  # the session
        print("ok")
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


SHARED_PROVIDER = """
    import random
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    random.seed(9)
    trace.set_tracer_provider(TracerProvider(shutdown_on_exit=False, sampler=SAMPLER))
    import cirron as ci
    ci.profile()
    for _ in range(5):
        random.seed(9)
        with ci.scope("s"):
            pass
    ci.shutdown()
    assert type(trace.get_tracer_provider().id_generator).__name__ == "RandomIdGenerator"
"""


@pytest.mark.parametrize(
    "sampler", ["None", "ParentBased(TraceIdRatioBased(1.0))"], ids=["default", "custom sampler"]
)
def test_on_a_shared_providers_default_generator_cirrons_ids_ignore_the_seed(tmp_path, sampler):
    # The lean path (default sampler) and the SDK path (a custom sampler) alike; the
    # provider's own generator is left as it was, for other tracers.
    for run in ("first", "second"):
        result = run_python(SHARED_PROVIDER.replace("SAMPLER", sampler), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        (tmp_path / ".cirron").rename(tmp_path / run)
    first_traces, first = ids_in(tmp_path / "first")
    second_traces, second = ids_in(tmp_path / "second")
    assert len(first) == len(set(first)) == len(second) == 6
    assert set(first).isdisjoint(second) and first_traces.isdisjoint(second_traces)
