"""When a boundary takes a model's snapshot, and when it skips it.

A snapshot holds the training thread for one copy of the model (the
capture); its statistics and files are finished on the snapshot thread. When
epochs are shorter than that background work, the next boundary finds the
previous snapshot of the model still in flight, and taking another one then
would cost the training thread far more than a capture: a wait for the
background work, or fresh staging memory and a copy that competes with it
for the cores. An always-on tracer must not slow training past its budget,
so:

- A model has at most one snapshot in flight.
- A boundary may hold training for at most :data:`HOLD_BUDGET` of its mode
  (``stats`` 50 ms, a boundary that writes raw tensors 200 ms, as the
  specification of ``ci.profile`` promises; ``full`` is for debugging and
  takes every boundary, waiting up to 30 s). A boundary that finds the
  previous snapshot still in flight waits for it only as long as the budget
  leaves after a capture, and not at all when the previous one's run time
  says it won't be done by then.
- Otherwise the boundary skips the model: no copy, no wait. The skip is
  counted in ``ci.health()["snapshots_skipped"]``, reported once, and the
  epoch span names the skipped models in its ``snapshot.skipped`` attribute.

So small models (background work of a millisecond) never miss a boundary,
and a large one with very short epochs is snapshotted as often as the
background thread can finish, without holding training for it.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from . import jobs as snapshot_jobs

# Seconds a boundary may hold the training thread: snapshot mode -> budget (raw: files written).
HOLD_BUDGET = {"stats": 0.05, "sampled": 0.2, "full": 30.0}
MIN_WAIT = 0.005  # seconds: enough for the snapshot thread to be scheduled and finish a small job


@dataclass
class _Model:
    """What pacing remembers of one watched model."""

    in_flight: snapshot_jobs.Job | None = None
    capture_seconds: float = 0.0  # how long the last capture held the training thread
    run_seconds: float | None = None  # how long the snapshot thread took for the last job


_models: weakref.WeakKeyDictionary[Any, _Model] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _state(model: Any) -> _Model:
    with _lock:
        state = _models.get(model)
        if state is None:
            state = _models[model] = _Model()
        return state


def budget(mode: str, raw: bool) -> float:
    """Seconds a boundary of ``mode`` may hold training (``raw``: it writes raw tensors)."""
    if mode == "full":
        return HOLD_BUDGET["full"]
    return HOLD_BUDGET["sampled"] if raw else HOLD_BUDGET["stats"]


def ready(model: Any, hold_budget: float) -> bool:
    """May this boundary take ``model``'s snapshot? Waits only when that pays; see above."""
    state = _state(model)
    job = state.in_flight
    if job is None or _finished(state, job):
        return True
    wait = max(MIN_WAIT, hold_budget - state.capture_seconds)
    if state.run_seconds is not None:
        elapsed = time.monotonic() - job.started if job.started is not None else 0.0
        if state.run_seconds - elapsed > wait:
            return False  # it won't be done in time: don't wait for nothing
    return snapshot_jobs.wait_finished(job, wait) and _finished(state, job)


def _finished(state: _Model, job: snapshot_jobs.Job) -> bool:
    if job.finished is None:
        return False
    if job.started is not None:
        state.run_seconds = job.finished - job.started
    state.in_flight = None
    return True


def taken(model: Any, job: snapshot_jobs.Job, capture_seconds: float) -> None:
    """``job`` is ``model``'s snapshot now in flight; its capture took ``capture_seconds``."""
    state = _state(model)
    state.in_flight = job
    state.capture_seconds = capture_seconds


def _forget_after_fork() -> None:
    # A forked child has no snapshot thread: the parent's jobs never finish there.
    global _models, _lock
    _models = weakref.WeakKeyDictionary()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
