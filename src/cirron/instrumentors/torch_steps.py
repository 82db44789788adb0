"""How the torch hooks find the steps, epochs and evaluation passes of a plain loop.

A plain torch loop has no callback that says "a step begins". The hooks see
lower-level moments (a batch fetched from a DataLoader, a forward, a backward,
an optimizer step, a loader running dry) and this module turns them into the
training moments of :mod:`cirron.training`, as the ``torch`` owner. Whether a
``step`` or ``epoch`` is opened at all is the core's decision: under
``ci.epochs``/``ci.batches`` or a framework's loop the torch owner yields.

**The work decides, not the loader.** A fetched batch waits (a
:class:`cirron.recording.training_state.Fetch`) until the program does something with
it: training work (a forward in train mode with gradients, a backward, an
optimizer step) makes its loader pass a training pass, and the batch the
first fetch of a step; a forward in eval mode or without gradients makes the
pass an evaluation pass. So a loader peeked at (``next(iter(loader))``), a
batch skipped with ``continue``, or the training loader iterated again for
evaluation never opens an epoch or a step.

- **A step** is the training work up to an optimizer moment
  (``optimizer.step()``, or ``GradScaler.step()`` whether or not it stepped).
  It runs from the start of the fetch of its first batch to the start of the
  next step's first fetch: every fetch of gradient accumulation's
  micro-batches is in the step that ends with the optimizer step. A step
  whose optimizer moment has passed stays open for the marks that follow;
  it ends when the next fetch begins, when evaluation begins, or when the
  program leaves the loop that repeats the steps (the core checks at the
  next mark or scope: see :mod:`cirron.training.loop_frames`). Without any loader,
  a step opens at the first training work after the previous one's optimizer
  moment (or backward, in a loop with no optimizer).
- **An epoch** is one pass of the training loop over its loader(s): loaders
  whose passes feed the same steps (zipped, or taken in turns) are one
  epoch's; a new pass over one of them, or any new pass once one of them ran
  dry, begins the next epoch, at the start of its first fetch. Work after the
  loader ran dry (a loader that fetches one batch ahead) still belongs to the
  epoch's last step, or to a step of its own when that one had its optimizer
  moment.
- **An evaluation pass** (``validate`` inside a training epoch, ``evaluate``
  outside one) is a loader pass whose batches go to forwards in eval mode or
  without gradients; it ends when its loader runs dry, when another loader
  is fetched from, or when training work resumes.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import Any

from .. import training
from ..recording import recorder, training_state
from ..recording.training_state import Fetch, TrainingState
from ..training import loop_frames

TORCH = training.owner("torch")
# Frames that are not the user's loop: torch's own, cirron's hooks, and the wrappers of
# loaders and optimizers that Accelerate and Lightning Fabric put around the user's.
_NOT_THE_USERS = ("torch", "cirron", "accelerate", "lightning")
# The loop that consumes a loader: not a generator that wraps it (a prefetcher).
_CONSUMING_LOOP = (*_NOT_THE_USERS, loop_frames.GENERATORS)
_pending = training_state.pending_fetches  # mutated in place, never rebound
_thread_id = threading.get_ident
_time_ns = time.time_ns

# What a loader pass turned out to feed.
UNKNOWN, TRAINING, EVALUATION, DRIVEN = range(4)
EXHAUSTED = StopIteration  # a fetch's outcome: the loader ran dry
MAX_WAITING = 64  # fetches that wait for work at most; older ones are recorded where they are


class LoaderPass:
    """One pass of one DataLoader iterator: what its batches have fed so far."""

    __slots__ = ("iterator", "loader", "role", "batches", "prior_training")

    def __init__(self, iterator: Any, loader: Any, prior_training: bool, driven: bool) -> None:
        self.iterator = weakref.ref(iterator)  # dead once the program dropped it (a peek)
        self.loader = loader  # what every iterator of one DataLoader shares (its sampler)
        self.role = DRIVEN if driven else UNKNOWN
        self.batches = 0
        # Gradients were on and a model in train mode when it began: how to read a scope or
        # mark made between a fetch and the first work on the batch.
        self.prior_training = prior_training

    @property
    def abandoned(self) -> bool:
        """The program dropped its iterator (a peek with ``next(iter(loader))``)."""
        return self.iterator() is None


def _state() -> Any:
    return (recorder.current or recorder.active()).training


class TorchLoop:
    """What the hooks have seen of the loop so far (forgotten when the hooks attach)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the loop seen so far (the hooks attach anew)."""
        self.has_optimizer = False  # steps end at optimizer steps (else at backwards)
        self.optimizer_steps = 0  # optimizer.step() calls so far (a GradScaler's may skip one)
        self.epoch_passes: list[LoaderPass] = []  # the training passes of the open epoch
        self.dry = False  # one of them ran dry: the epoch's last work may still come
        self.evaluation_pass: LoaderPass | None = None  # the pass of the open evaluation
        self.training_thread: int | None = None  # the thread of the last training work

    # -- fetches -------------------------------------------------------------------------------
    def fetch_begins(self, loader_pass: LoaderPass, now: int) -> None:
        """A fetch from ``loader_pass`` begins at ``now``: the step before it is over."""
        if loader_pass.role == DRIVEN:
            return
        step = (recorder.current or recorder.active()).training.step  # no call: every batch
        if step is not None and step.owner is TORCH and step.complete:
            training.end_step(TORCH, end_ns=now)
        if self.evaluation_pass is not None and self.evaluation_pass is not loader_pass:
            self.evaluation_pass = None
            training.end_evaluation(TORCH, end_ns=now)
        if loader_pass.batches == 0 and self.epoch_passes and loader_pass.role == UNKNOWN:
            if self.dry or any(p.loader is loader_pass.loader for p in self.epoch_passes):
                training.epoch_boundary(TORCH)  # a new pass: the model is final for the epoch

    def fetch_ends(self, loader_pass: LoaderPass, started: int, outcome: Any) -> None:
        """The fetch that began at ``started`` returned a batch (``outcome`` None), found the
        loader dry (:data:`EXHAUSTED`), or raised (``outcome`` is the exception)."""
        if loader_pass.role == DRIVEN:
            self._driven_fetch(loader_pass, started, outcome)
            return
        fetch = Fetch(started, _time_ns(), None, loader_pass)
        if self.training_thread is not None and _thread_id() != self.training_thread:
            training.record_fetches([fetch])  # a thread of its own that prefetches: not a step's
            return
        if outcome is not None:
            if outcome is EXHAUSTED:
                self._exhausted(loader_pass, fetch)
                return
            fetch.error = outcome
        loader_pass.batches += 1
        state = (recorder.current or recorder.active()).training  # no call: every batch
        if loader_pass is self.evaluation_pass:
            evaluation = state.evaluation
            if evaluation is not None and evaluation.owner is TORCH:
                evaluation.batches += 1
                training.record_fetches([fetch], evaluation.opened[0])
                return
            self.evaluation_pass = None
        step = state.step
        if loader_pass.role == TRAINING and step is not None and step.owner is TORCH:
            if not step.complete:  # another micro-batch of this step
                training.record_fetches([fetch], step.opened[0])
                return
        _pending.append(fetch)
        if outcome is not None:  # an error: recorded now, in case it ends the training
            self.settle()
        elif len(_pending) > MAX_WAITING:  # a loop that does no torch work with its batches
            waiting = training.take_fetches()
            training.record_fetches(waiting[:-1])
            _pending.append(waiting[-1])

    def _exhausted(self, loader_pass: LoaderPass, fetch: Fetch) -> None:
        state = _state()
        if loader_pass is self.evaluation_pass:
            self.evaluation_pass = None
            evaluation = state.evaluation
            if evaluation is not None and evaluation.owner is TORCH:
                training.record_fetches([fetch], evaluation.opened[0])
                training.end_evaluation(TORCH)
                return
        # Its fetches that no work followed (batches skipped with `continue`), and this one.
        waiting = [f for f in training.take_fetches() if not self._keep(f, loader_pass)]
        waiting.append(fetch)
        if loader_pass.role != TRAINING or not training.may_own(TORCH):
            training.record_fetches(waiting)  # a pass nothing was trained on: where we are
            return
        self.dry = True
        epoch = state.epoch
        training.record_fetches(waiting, epoch.opened[0] if epoch is not None else None)
        step = state.step
        if step is not None and step.owner is TORCH and not step.complete:
            # The last batches' work may still come (a loader that fetches ahead); once the
            # program leaves this loop, the step ends (accumulation with no final step).
            training.step_left_with(TORCH, loop_frames.position(sys._getframe(1), _CONSUMING_LOOP))

    def _keep(self, fetch: Fetch, loader_pass: LoaderPass) -> bool:
        """Put ``fetch`` back to wait, unless it is ``loader_pass``'s."""
        if fetch.source is loader_pass:
            return False
        _pending.append(fetch)
        return True

    def _driven_fetch(self, loader_pass: LoaderPass, started: int, outcome: Any) -> None:
        """A loader ``ci.batches`` drives: its batches are the steps; the epochs are ours."""
        if outcome is not None or not loader_pass.prior_training:
            return
        first = loader_pass.batches == 0
        loader_pass.batches += 1
        if first or _state().epoch is None:
            training.begin_epoch(TORCH, start_ns=started)

    # -- the work ------------------------------------------------------------------------------
    def training_work(self) -> None:
        """A forward in train mode with gradients, a backward, or an optimizer moment."""
        if _pending:
            self._begin_training_step()
            return
        state = (recorder.current or recorder.active()).training  # no call: every hook
        if self.evaluation_pass is not None:  # training again, with no fetch in between
            self.evaluation_pass = None
            training.end_evaluation(TORCH)
        step = state.step
        if step is None:
            training.begin_step(TORCH, fallback_epoch=not self.epoch_passes)
        elif step.owner is TORCH and step.complete and (self.dry or not self.epoch_passes):
            # No fetch marks the batch (no loader, or the loader ran dry): a new step.
            training.begin_step(TORCH, fallback_epoch=not self.epoch_passes)

    def _begin_training_step(self) -> None:
        """The waiting fetches fed training work: their step (and epoch) begin where the
        first of them began."""
        if not training.may_own(TORCH):  # a framework's step or pass: they are its
            training.record_fetches(training.take_fetches())
            return
        self.training_thread = _thread_id()
        fetches = training.take_fetches()
        state = (recorder.current or recorder.active()).training
        step = state.step
        if len(fetches) == 1 and fetches[0].source.role == TRAINING:  # the next batch, as usual
            if step is not None and step.owner is TORCH and not step.complete:
                training.record_fetches(fetches, step.opened[0])
            else:
                training.begin_step(TORCH, fetches=fetches)
            return
        fetches = self._fed(fetches)
        if not fetches:
            self.training_work()
            return
        passes: list[LoaderPass] = []
        for fetch in fetches:
            if fetch.source not in passes:
                passes.append(fetch.source)
        new = [p for p in passes if p.role != TRAINING]
        start = fetches[0].start_ns
        if new:
            if self._begins_epoch(state, new):
                training.begin_epoch(TORCH, start_ns=start)  # the last one ends there
                self.epoch_passes, self.dry = passes, False
            else:  # another loader of this epoch's loop (zipped, or in turns)
                self.epoch_passes.extend(new)
            for loader_pass in new:
                loader_pass.role = TRAINING
        if self.evaluation_pass is not None:
            self.evaluation_pass = None
            training.end_evaluation(TORCH, end_ns=start)
        step = state.step
        if step is not None and step.owner is TORCH and not step.complete:
            training.record_fetches(fetches, step.opened[0])  # more batches of this step
        else:
            training.begin_step(TORCH, fetches=fetches)

    def _begins_epoch(self, state: TrainingState, new: list[LoaderPass]) -> bool:
        """Do the passes in ``new`` begin the next epoch, or join the open one?"""
        epoch = state.epoch
        if epoch is None or epoch.owner is not TORCH or epoch.fallback or self.dry:
            return True
        loaders = [p.loader for p in self.epoch_passes]
        return any(p.loader in loaders for p in new)

    def _fed(self, fetches: list[Fetch]) -> list[Fetch]:
        """``fetches`` that fed the work: not those of a dropped iterator (a peek), nor of a
        pass that a newer pass over the same loader replaced; those are recorded where the
        program was."""
        fetches = training.fed(fetches)
        if len(fetches) < 2:
            return fetches
        replaced = [
            fetch
            for position, fetch in enumerate(fetches)
            if any(
                later.source is not fetch.source and later.source.loader is fetch.source.loader
                for later in fetches[position + 1 :]
            )
        ]
        if replaced:
            training.record_fetches(replaced)
            fetches = [fetch for fetch in fetches if fetch not in replaced]
        return fetches

    def evaluation_work(self, frame: Any) -> None:
        """A forward in eval mode or without gradients (``frame``: the hook's caller)."""
        if self.training_thread is not None and _thread_id() != self.training_thread:
            return  # another thread's evaluation: the training loop's moments are not its
        if _pending:
            source = _pending[-1].source
            if isinstance(source, LoaderPass) and source.role != TRAINING:
                if not source.prior_training:
                    self._begin_evaluation(source, frame)
            return  # (else a forward inside a training iteration: a teacher's, say)
        step = _state().step
        if step is not None and step.complete:
            training.end_completed_step(TORCH)

    def _begin_evaluation(self, source: LoaderPass, frame: Any) -> None:
        if not training.may_own(TORCH):
            training.record_fetches(training.take_fetches())
            return
        fetches = self._fed(training.take_fetches())
        others = [f for f in fetches if f.source is not source]
        if others:  # fetches of other loaders that no work followed: where we are
            training.record_fetches(others)
        mine = [f for f in fetches if f.source is source]
        if not mine:
            return
        loop = loop_frames.position(frame, _NOT_THE_USERS)
        if training.begin_evaluation(TORCH, fetches=mine, loop=loop) is not None:
            source.role = EVALUATION
            self.evaluation_pass = source

    def settle(self) -> None:
        """A scope or mark comes between a fetch and the first work on its batch: the pass
        is read as it began (gradients on and a model training: training)."""
        if not _pending or (
            self.training_thread is not None and _thread_id() != self.training_thread
        ):
            return
        source = _pending[-1].source
        if isinstance(source, LoaderPass) and not source.prior_training:
            if source.role != TRAINING:
                self._begin_evaluation(source, sys._getframe(2))
                return
        self.training_work()

    def backward_done(self) -> None:
        if not self.has_optimizer:  # a loop with no optimizer (so far): its backward ends it
            self._complete(sys._getframe(1))

    def optimizer_built(self) -> None:
        self.has_optimizer = True

    def optimizer_stepping(self) -> None:
        self.optimizer_steps += 1
        if not self.has_optimizer:
            # The first optimizer step of a loop whose optimizer was built before the
            # hooks attached: the backward did not end this step after all.
            self.has_optimizer = True
            training.reopen_step(TORCH)
        self.training_work()

    def optimizer_stepped(self, frame: Any) -> None:
        """The optimizer step called from ``frame`` is over: the step's work is done."""
        self._complete(frame)

    def skipped_step(self, attributes: dict[str, Any], frame: Any) -> None:
        """A ``GradScaler.step`` that found inf/NaN gradients and skipped the optimizer: still
        the step's optimizer moment, and the step says so (``attributes``)."""
        self.training_work()
        step = _state().step
        if step is not None and step.owner is TORCH:
            for key, value in attributes.items():
                step.opened[0].set_attribute(key, value)
            self._complete(frame)

    def _complete(self, frame: Any) -> None:
        step = (recorder.current or recorder.active()).training.step  # no call: every hook
        if step is not None and step.owner is TORCH:
            training.complete_step(TORCH, loop_frames.position(frame, _NOT_THE_USERS))


LOOP = TorchLoop()  # the one loop the hooks report to (reset when they attach)
