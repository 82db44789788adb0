"""Keras loops of the user's own over ``train_on_batch`` and ``test_on_batch``.

A loop that calls ``model.train_on_batch(x, y)`` for each batch (a GAN's
alternating updates, a curriculum, a custom schedule) runs no callback: these
hooks report its moments, as the ``tensorflow`` owner, on every backend.

- Each ``train_on_batch`` is a ``step``: Keras's forward, gradients and
  optimizer update for one batch. It begins when the call does and stays open
  after it for the marks that follow (``ci.mark("loss", logs)``), until the
  next step or evaluation begins or the program leaves the loop that repeats
  it. With no ``ci.epochs`` around the loop, the steps are grouped in a
  fallback epoch of at most ``epoch_steps`` steps, as a torch loop without a
  DataLoader is (Keras cannot see where the user's epochs begin).
- Consecutive ``test_on_batch`` calls are one evaluation pass: ``validate``
  inside a training epoch, ``evaluate`` outside one, with ``batches``. It ends
  when training resumes, or once the program has left its loop (at the next
  mark or scope).

Inside ``fit``/``evaluate``/``predict`` Keras's callback owns the moments;
these hooks add nothing there.
"""

from __future__ import annotations

import sys
from typing import Any

from .. import training
from ..recording import recorder
from ..training import loop_frames

# Frames that are not the user's loop: Keras's, its backends', and cirron's.
_NOT_THE_USERS = ("keras", "tf_keras", "tensorflow", "torch", "jax", "cirron")


def _users_loop() -> Any:
    """The user's loop around the call being reported (outside Keras and cirron)."""
    return loop_frames.position(sys._getframe(1), _NOT_THE_USERS)


def _ours(owner: Any) -> bool:
    """May the batch loop's moments be reported: profiling, no higher owner, and not inside
    ``fit``/``evaluate``/``predict`` (a callback calling ``test_on_batch``: Keras's)."""
    if recorder.current is None or not training.may_own(owner):
        return False
    return owner not in training.state().holders


def train_batch_begins(owner: Any) -> bool | None:
    """A ``train_on_batch`` begins: its step (None when it is not ours to report). Keras's
    work inside it holds the levels: a lower owner's hooks, or a custom loop's, add none."""
    if not _ours(owner):
        return None
    training.end_evaluation(owner)
    if not training.begin_step(owner, fallback_epoch=True):
        return None
    training.hold(owner)
    return True


def train_batch_ends(owner: Any, error: BaseException | None) -> None:
    """The ``train_on_batch`` returned (its step stays open for marks) or raised."""
    training.release(owner)
    if error is not None:
        training.end_step(owner, error)
        return
    training.complete_step(owner, _users_loop())


def test_batch_begins(owner: Any) -> bool | None:
    """A ``test_on_batch``: the first of a pass opens it; each counts as one of its batches."""
    if not _ours(owner):
        return None
    evaluation = training.state().evaluation
    if evaluation is None or evaluation.owner is not owner:
        evaluation = training.begin_evaluation(owner, loop=_users_loop())
    if evaluation is not None:
        evaluation.batches += 1
    training.hold(owner)
    return True


def test_batch_ends(owner: Any, error: BaseException | None) -> None:
    training.release(owner)


def end_moments(owner: Any) -> None:
    """The hooks come off: the step, pass and epoch a batch loop left open end."""
    training.end_evaluation(owner)
    training.end_step(owner)
    training.end_epoch(owner)
