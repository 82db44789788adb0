"""Per-batch cost of the Keras callback: ``model.fit`` bare vs instrumented, interleaved.

A small Keras MLP (32 → 64 → 64 → 10, batch 32, SGD) trained on in-memory
arrays with TensorFlow on one thread. One pair is two ``fit(epochs=1)`` calls
of ``_BATCHES`` batches each, bare and under ``ci.profile(output="none")``,
back to back in alternating order (the SDK's hooks go on at ``ci.profile``
and off at ``ci.shutdown``). A batch's time is the training thread's CPU
time from one batch's start to the next's, as a user's callback sees it
(the median over the fit's batches: a garbage collection or the epoch's end
doesn't move it); it includes everything the SDK does per batch (the
``batch`` span, its logged values as marks). The figure is the median over
pairs of the difference.

:func:`measure` runs in fresh processes under this package and under the
reference SDK alike, ours and the reference's alternating; the reference
needs an interpreter with TensorFlow (``bash scripts/frameworks-venvs.sh``).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from . import reference
from .table import Row, half_iqr

_BATCHES = 200
_BATCH_SIZE = 32


def _case() -> Any:
    """``fit()`` once over ``_BATCHES`` batches: returns the seconds it took."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    generator = np.random.default_rng(0)
    x = generator.normal(size=(_BATCHES * _BATCH_SIZE, 32)).astype("float32")
    y = generator.integers(0, 10, size=(_BATCHES * _BATCH_SIZE,))

    class Clock(keras.callbacks.Callback):
        """The user's side of each pair: when each batch begins (thread CPU time)."""

        def __init__(self) -> None:
            super().__init__()
            self.begins: list[int] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.begins.append(time.thread_time_ns())

    def fit() -> float:
        clock = Clock()
        model.fit(
            x, y, batch_size=_BATCH_SIZE, epochs=1, shuffle=False, verbose=0, callbacks=[clock]
        )
        gaps = [b - a for a, b in zip(clock.begins, clock.begins[1:], strict=False)]
        return statistics.median(gaps)

    return fit


def measure(rounds: int) -> list[list[float]]:
    """[bare, instrumented] ns per batch (median) for each pair; runs in a subprocess."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import cirron as ci

    fit = _case()
    for _ in range(3):  # warm-up: the train function is traced on the first call
        fit()
    ci.profile(output="none")
    fit()  # the first instrumented fit pays for first calls (imports, the snapshot thread)
    ci.shutdown()
    pairs = []
    for round_index in range(rounds):
        pair = [0.0, 0.0]
        for instrumented in (False, True) if round_index % 2 else (True, False):
            if instrumented:
                ci.profile(output="none")
            pair[instrumented] = fit()
            if instrumented:
                ci.shutdown()
        pairs.append(pair)
    return pairs


def _added(pairs: list[list[float]]) -> float:
    return statistics.median(on - off for off, on in pairs)


def run(quick: bool = False) -> list[Row]:
    """The bare batch, and what each SDK adds to it."""
    import keras  # noqa: F401 - ImportError: the caller skips these rows

    rounds, runs = (4, 1) if quick else (30, 2)
    code = reference.call_snippet("keras_fit", "measure", rounds=rounds)
    ours_python = None  # this interpreter: the test environment has TensorFlow
    theirs_python = reference.frameworks_pythons()[1]
    ours_runs, theirs_runs = reference.run_both(code, runs, (ours_python, theirs_python))
    ours = [pair for result in ours_runs for pair in result]
    theirs = [pair for result in theirs_runs or [] for pair in result] or None
    bare = statistics.median(off for off, _ in ours)
    return [
        Row(
            "Keras MLP fit, per batch",
            bare + _added(ours),
            "same fit, no callback",
            bare,
            "us",
            (statistics.median(off for off, _ in theirs) + _added(theirs)) if theirs else None,
            spread=half_iqr(on - off for off, on in ours),
        ),
        Row(
            "  added per batch by the callback",
            _added(ours),
            "",
            None,
            "us",
            _added(theirs) if theirs else None,
            spread=half_iqr(on - off for off, on in ours),
            note=(
                "Keras: fit(epochs=1) of 200 batches of 32, bare and instrumented back to back; "
                "the training thread's CPU time from batch start to batch start (median over the "
                "fit), TensorFlow on one thread"
            ),
        ),
    ]
