"""Trace and span ids that no seeding of the program can repeat.

The SDK's default ``RandomIdGenerator`` draws from Python's global ``random``.
Training scripts seed it (``random.seed``, ``transformers.set_seed``,
``lightning.seed_everything``, ``keras.utils.set_random_seed``), so every run
of a seeded script would get the same trace id and the same span ids, and a
library that saves and restores the global state would make later spans
reuse ids already exported. Worse, every id drawn advances the user's own
random stream: profiling would change what a seeded script computes.

cirron's ids come from a generator of its own, seeded from ``os.urandom``
when this module is imported and again in every forked child (a DataLoader
worker, a ``multiprocessing`` child, a rank started by fork), so they are
unique across spans, runs, processes and forks whatever the program does to
Python's, NumPy's or torch's generators, and drawing them touches none of
those. Drawing costs the same as the SDK's (one C call).

The one exception is deliberate: :func:`run_ids` derives the trace id of a
run from its run id, so that every rank of the run (each its own process)
records into one trace; the span ids inside stay random.

A provider's own ``id_generator`` (one the user chose, such as AWS X-Ray's)
is honoured: :func:`private_ids` tells the span paths when to use this one.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

# Never reseeded from anything the program controls: only os.urandom.
_generator = random.Random()
# The hot path calls this bound method directly (a span id is 64 random bits).
random_bits = _generator.getrandbits


def _reseed() -> None:
    _generator.seed()  # no argument: os.urandom


if hasattr(os, "register_at_fork"):
    # A forked child starts with the parent's generator state: without this it
    # would draw the very ids its parent draws next.
    os.register_at_fork(after_in_child=_reseed)


class PrivateIdGenerator(IdGenerator):
    """Random trace and span ids from cirron's own generator (see the module docstring)."""

    def generate_span_id(self) -> int:
        span_id = random_bits(64)
        while span_id == 0:  # the invalid id
            span_id = random_bits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = random_bits(128)
        while trace_id == 0:
            trace_id = random_bits(128)
        return trace_id

    def is_trace_id_random(self) -> bool:
        return True


ID_GENERATOR = PrivateIdGenerator()


def private_ids(generator: Any) -> bool:
    """True when ``generator`` is a default one that cirron's own may stand in for.

    The SDK's stock ``RandomIdGenerator`` is what a provider gets when nobody
    chose a generator; any other (a subclass included) is the user's choice.
    """
    return type(generator) is RandomIdGenerator or type(generator) is PrivateIdGenerator


def run_ids(run_id: str) -> tuple[int, int]:
    """(trace id, span id) of the run ``run_id``: the same in every process of the run.

    The span id is the run's virtual root: a parent for sessions the SDK has
    to start (see :func:`cirron.otel.provider.run_root`); no span with it is ever
    recorded.
    """
    digest = hashlib.sha256(f"cirron-run/{run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def epoch_trace_id(run: str, index: int) -> int:
    """The trace of epoch ``index`` of the run ``run`` once a long run splits its trace.

    The same in every rank of the run, so one epoch of all ranks is one trace.
    """
    digest = hashlib.sha256(f"cirron-epoch/{run}/{index}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1
