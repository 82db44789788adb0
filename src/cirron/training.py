"""Step and epoch boundaries of a training loop, shared by every framework hook.

Hooks report moments ("a training loader started", "a batch fetch began",
"the optimizer stepped", "a training forward ran"); this module decides when
``step`` and ``epoch`` spans open and close, so the policy lives once:

- A **step** runs from the fetch of its first batch to the fetch of the next
  step's first batch (several fetches, forwards and backwards per optimizer
  step are one step: gradient accumulation). Without a DataLoader, a step
  opens at the first training forward/backward after the previous optimizer
  step. Either way it stays open until the next step begins, the training
  loader is exhausted, or the epoch ends, so a mark made after
  ``optimizer.step()`` lands on its step. Step indexes count the whole run.
- A **prefetching** loader (accelerate's, under HF Trainer) runs dry before
  the last batches it delivered are used. When it does, a step whose batches
  have not reached a backward yet stays open, and from then until the next
  training pass the steps follow the work (forward/backward to optimizer
  step, as without a DataLoader); each of those ends at its optimizer step,
  so a validation run after them is not inside a step.
- An **epoch** begins with the first fetch of a new training-loader iterator
  and ends when the next one begins (its loader was exhausted or abandoned),
  so validation and marks after the inner loop land inside it. Without a
  DataLoader, an epoch is every ``epoch_steps`` optimizer steps, the first of
  them in epoch 0.
- **Yielding**: when an ``epoch`` (or ``batch``/``step``) span that these
  rules did not open is open in the current context (``ci.epochs``,
  ``ci.batches``, a higher-level framework), no epoch (or step) is opened
  here; a loader driven by ``ci.batches`` never opens steps.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from . import boundaries, recorder
from .scopes import Scope, close_span, current_span, current_span_chain, open_span
from .spans import ScopeSpan

DEFAULT_EPOCH_STEPS = 1000


class TrainingLoop:
    def __init__(self, epoch_steps: int = DEFAULT_EPOCH_STEPS) -> None:
        self.epoch_steps = epoch_steps
        self.epoch: Scope | None = None
        self.step: tuple[Any, Any, Any] | None = None  # what close_span needs
        self.step_index = 0  # the next step's index (whole run)
        self.stepped = False  # the open step has seen an optimizer step
        self.steps_in_epoch = 0
        self.loader_driven = False  # training fetches (not forwards) open steps
        self.loader_dry = False  # the training loader ran dry; the work still goes on
        self.batch_used = False  # a backward ran since the last training fetch (hooks set it)
        # Another epoch/batch/step (ci.batches, a framework) encloses our epoch.
        self._epoch_inside_others = False
        self._training_iterator: weakref.ref[Any] | None = None
        self._lock = threading.RLock()

    # -- ownership --------------------------------------------------------------
    def _others_hold(self, *names: str) -> bool:
        """An open span of one of ``names`` that this loop did not open."""
        ours = {id(span) for span in (self._epoch_span(), self.step and self.step[0]) if span}
        return any(
            getattr(span, "name", None) in names and id(span) not in ours
            for span in current_span_chain()
        )

    def _epoch_span(self) -> Any:
        return self.epoch.span if self.epoch is not None else None

    def _step_yields(self) -> bool:
        """A step/batch that is not ours is open: the step is not ours to open.

        The common case costs one comparison: right under our own epoch,
        which was checked for enclosing steps and batches when it opened.
        """
        span = self._epoch_span()
        if span is not None and current_span() is span:
            return self._epoch_inside_others
        return self._others_hold("step", "batch")

    # -- spans ------------------------------------------------------------------
    def _open_epoch(self, start_ns: int | None = None) -> None:
        self._close_epoch()
        if self._others_hold("epoch"):
            return
        rec = recorder.current or recorder.active()
        index = rec.extras.get("epochs_started", 0)
        rec.extras["epochs_started"] = index + 1
        self.epoch = Scope("epoch", {"index": index}, start_ns)
        self.epoch.__enter__()
        self._epoch_inside_others = self._others_hold("step", "batch")
        self.steps_in_epoch = 0

    def _close_epoch(self) -> None:
        self._close_step()
        epoch, self.epoch = self.epoch, None
        if epoch is not None:
            boundaries.epoch_ending(epoch.span)
            epoch.__exit__(None, None, None)

    def _open_step(self, start_ns: int | None = None) -> None:
        self._close_step()
        if self._step_yields():
            return
        self.step = open_span("step", {"index": self.step_index}, start_ns)
        self.step_index += 1
        self.stepped = False

    def _close_step(self) -> None:
        step, self.step = self.step, None
        if step is not None:
            close_span(step)

    # -- moments reported by hooks -------------------------------------------------
    def training_fetch(self, iterator: Any, started_ns: int, driven_by_batches: bool) -> None:
        """A training loader's iterator returned a batch; its fetch began at ``started_ns``.

        Told after the fetch (so the fetch that only finds the loader exhausted
        opens nothing), the new step and epoch are backdated to the fetch start.
        """
        with self._lock:
            previous = self._training_iterator() if self._training_iterator else None
            if previous is not iterator:  # a new pass over the training data
                self._training_iterator = weakref.ref(iterator)
                self.loader_driven = True
                self.loader_dry = False
                self._open_epoch(started_ns)
            elif self.epoch is None and not self._others_hold("epoch"):
                self._open_epoch(started_ns)
            if driven_by_batches:
                return
            self.batch_used = False
            if self.step is None or self.stepped:
                self._open_step(started_ns)

    def training_loader_exhausted(self, iterator: Any, driven_by_batches: bool = False) -> None:
        with self._lock:
            self._training_iterator = None  # a persistent-workers iterator may start over
            if driven_by_batches:
                return
            # A step whose batches are fetched but not used yet (a prefetching
            # loader) goes on; any other ends here, as the loader ran dry.
            if self.step is None or self.stepped or self.batch_used:
                self._close_step()
            # The work still to come (a prefetcher's last batches) drives the
            # steps until the next pass.
            self.loader_dry = True
            self.loader_driven = False

    def training_activity(self) -> None:
        """A forward or backward in training mode (steps without a DataLoader)."""
        if self.loader_driven:  # fetches open the steps
            return
        with self._lock:
            if self.step is not None and not self.stepped:
                return
            if self.loader_dry:  # after the loader ran dry: no fallback epochs
                self._open_step()  # (unless another step or batch is open)
                return
            if self.stepped and self.steps_in_epoch >= self.epoch_steps:
                self._close_epoch()  # the fallback epoch boundary
            if self.epoch is None and not self._others_hold("epoch", "batch", "step"):
                self._open_epoch()
            self._open_step()

    def optimizer_stepped(self) -> None:
        with self._lock:
            self.steps_in_epoch += 1
            if self.loader_dry:  # a step after the loader ran dry ends here
                self._close_step()
                return
            if self.step is None and not self.loader_driven:
                # optimizer.step() with no forward seen (e.g. a closure-only loop)
                if self.epoch is None and not self._others_hold("epoch", "batch", "step"):
                    self._open_epoch()
            self.stepped = True

    def epoch_ending(self, epoch_span: Any) -> None:
        """An epoch someone else opened (``ci.epochs``, a framework) is ending.

        A step stays open until the next one begins, so the last step of that
        epoch is still open here: it ends with its epoch, not in the next one.
        """
        with self._lock:
            if self.step is not None and _inside(self.step[0], epoch_span):
                self._close_step()

    def close(self) -> None:
        with self._lock:
            self._close_epoch()


def _inside(span: Any, ancestor: Any) -> bool:
    """``span`` is ``ancestor`` or one of its descendants."""
    while isinstance(span, ScopeSpan):
        if span is ancestor:
            return True
        span = span._parent_span
    if span is ancestor:
        return True
    parent = getattr(span, "parent", None)  # an SDK span knows only its parent's context
    return parent is not None and parent.span_id == ancestor.get_span_context().span_id


def _epoch_ending(epoch_span: Any) -> None:
    rec = recorder.current
    state = rec.extras.get("training_loop") if rec is not None else None
    if state is not None:
        state.epoch_ending(epoch_span)


boundaries.before_epoch_end("training loop", _epoch_ending)


def loop() -> TrainingLoop:
    """The training loop state of the current recorder (made on first use)."""
    rec = recorder.current or recorder.active()
    state = rec.extras.get("training_loop")
    if state is None:
        steps = rec.extras.get("epoch_steps", DEFAULT_EPOCH_STEPS)
        state = rec.extras["training_loop"] = TrainingLoop(steps)
    return state  # type: ignore[no-any-return]
