"""How the torch hooks find the steps and epochs of a plain loop, and report them.

A plain torch loop has no callback that says "a step begins". The hooks see
lower-level moments (a batch fetched from a training DataLoader, a training
forward or backward, an optimizer step, the loader running dry) and this
module turns them into the training moments of :mod:`cirron.training`, as
the ``torch`` owner. Whether a ``step`` or ``epoch`` is opened at all is the
core's decision: under ``ci.epochs``/``ci.batches`` or a framework's loop the
torch owner yields, and its reports change nothing.

- **With a DataLoader**, a step runs from the fetch of its first batch to the
  fetch of the next step's first batch (several fetches, forwards and
  backwards per optimizer step are one step: gradient accumulation), or to the
  loader running dry; an epoch is a pass over the training loader, from its
  first fetch until the next pass begins.
- **A prefetching loader** (accelerate's) runs dry before the last batches it
  delivered are used. When it does, a step whose batches have not reached a
  backward yet goes on, and until the next pass the steps follow the work
  (first forward or backward to the optimizer step), each ending at its
  optimizer step.
- **Without a DataLoader**, a step opens at the first training forward or
  backward after the previous step's work is done. Its work is done at the
  optimizer step, or, in a loop with no optimizer (parameters updated by hand),
  at the backward: so the next training forward after a backward begins the
  next step. A loop has an optimizer once one was built or stepped while the
  hooks were on. Epochs are every ``epoch_steps`` steps (a fallback epoch).
- A step whose work is done stays open for the marks made after
  ``optimizer.step()``; it ends when the next step begins, when evaluation
  begins (a forward in eval mode or without gradients), or when the program
  leaves the loop that repeats the steps (the core checks at the next mark or
  scope: see :mod:`cirron.loop_frames`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from .. import loop_frames, recorder, training

TORCH = training.owner("torch")
# Frames that are not the user's loop: torch's own, and cirron's hooks.
_NOT_THE_USERS = ("torch", "cirron")


class TorchLoop:
    """What the hooks have seen of the loop so far (reset when the hooks attach)."""

    def __init__(self) -> None:
        self.loader_driven = False  # training fetches (not forwards) open the steps
        self.loader_dry = False  # the training loader ran dry; the work still goes on
        self.batch_used = False  # a backward ran since the last training fetch
        self.has_optimizer = False  # steps end at optimizer steps (else at backwards)
        self._training_iterator: weakref.ref[Any] | None = None

    # -- a training DataLoader -------------------------------------------------------------
    def training_fetch(self, iterator: Any, started_ns: int, driven_by_batches: bool) -> None:
        """A training loader's iterator returned a batch; its fetch began at ``started_ns``.

        Told after the fetch (so the fetch that only finds the loader exhausted
        opens nothing), the new step and epoch are backdated to the fetch start.
        """
        previous = self._training_iterator() if self._training_iterator else None
        if previous is not iterator:  # a new pass over the training data
            self._training_iterator = weakref.ref(iterator)
            self.loader_driven, self.loader_dry = True, False
            training.begin_epoch(TORCH, start_ns=started_ns)
        elif (recorder.current or recorder.active()).training.epoch is None:
            training.begin_epoch(TORCH, start_ns=started_ns)
        if driven_by_batches:  # ci.batches' batch spans are the steps
            return
        self.batch_used = False
        step = (recorder.current or recorder.active()).training.step  # no call: every hook
        if step is None or step.owner is TORCH and step.complete:
            training.begin_step(TORCH, start_ns=started_ns)

    def training_loader_exhausted(self, driven_by_batches: bool) -> None:
        self._training_iterator = None  # a persistent-workers iterator may start over
        if driven_by_batches:
            return
        # A step whose batches are fetched but not used yet (a prefetching loader)
        # goes on; any other ends here, as the loader ran dry.
        step = training.step_of(TORCH)
        if step is None or step.complete or self.batch_used:
            training.end_step(TORCH)
        # The work still to come (a prefetcher's last batches) drives the steps
        # until the next pass.
        self.loader_dry, self.loader_driven = True, False

    # -- the work ------------------------------------------------------------------------------
    def training_work(self) -> None:
        """A forward in training mode with gradients, or a backward: a step's work."""
        if self.loader_driven:  # fetches open the steps
            return
        step = (recorder.current or recorder.active()).training.step  # no call: every hook
        if step is not None and (step.owner is not TORCH or not step.complete):
            return  # this step's work goes on, or a higher owner's step has it
        # After the loader ran dry, steps without fallback epochs: the pass's epoch goes on.
        training.begin_step(TORCH, fallback_epoch=not self.loader_dry)

    def evaluation_work(self) -> None:
        """A forward in eval mode or without gradients: a step whose work is done ends."""
        step = (recorder.current or recorder.active()).training.step  # no call: every hook
        if step is not None and step.complete:
            training.end_completed_step(TORCH)

    def backward_done(self) -> None:
        self.batch_used = True
        if not self.has_optimizer:  # a loop with no optimizer (so far): its backward ends it
            self._complete(sys._getframe(1))

    def optimizer_built(self) -> None:
        self.has_optimizer = True

    def optimizer_stepping(self) -> None:
        if not self.has_optimizer:
            # The first optimizer step of a loop whose optimizer was built before the
            # hooks attached: the backward did not end this step after all.
            self.has_optimizer = True
            training.reopen_step(TORCH)
        self.training_work()

    def optimizer_stepped(self) -> None:
        if self.loader_dry:  # a step after the loader ran dry ends here
            training.end_step(TORCH)
            return
        # The user's loop is above the post hook, its guard and torch's optimizer
        # wrapper: start there (loop_frames skips cirron's and torch's frames anyway).
        self._complete(sys._getframe(3))

    def _complete(self, frame: Any) -> None:
        step = (recorder.current or recorder.active()).training.step  # no call: every hook
        if step is not None and step.owner is TORCH:
            training.complete_step(TORCH, loop_frames.position(frame, _NOT_THE_USERS))
