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

**A batch is judged by all of its work.** A forward in eval mode or without
gradients on the first batch of a pass does not decide the pass alone: a
teacher's, a frozen backbone's or an attack's forward comes before the
training work on the same batch, and an evaluator may call ``model.eval()``
after its batch was fetched. Its span is held (:attr:`TorchLoop.held`) until
the batch is judged: training work on it opens its step (and epoch) at the
fetch and puts the held forwards inside; the next fetch, the loader running
dry, or a mark made without gradients or with no model training makes it an
evaluation pass's first batch. Later batches of a pass judged training open
their step at their first forward, whatever its mode. An evaluation forward
on a loader that trained in no epoch so far, once training has begun (a
validation loader in eval mode), still begins its pass at once.

**Loaders in one outer iteration.** A new pass over a loader the epoch has
not used, once the epoch's passes ran dry, joins the epoch when another loop
of the program consumes it (two models trained in turn, each on its own
loader); the loop that consumed the epoch's first pass, run again (with a
loader built anew for each epoch, say), begins the next epoch.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import training
from ..otel import semconv
from ..recording import hook_spans, hot, recorder, training_state
from ..recording.scopes import current_span
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
_CO_GENERATOR = inspect.CO_GENERATOR

# What a loader pass turned out to feed.
UNKNOWN, TRAINING, EVALUATION, DRIVEN = range(4)
EXHAUSTED = StopIteration  # a fetch's outcome: the loader ran dry
MAX_WAITING = 64  # fetches that wait for work at most; older ones are recorded where they are


class LoaderPass:
    """One pass of one DataLoader iterator: what its batches have fed so far."""

    __slots__ = ("iterator", "loader", "role", "batches", "prior_training", "loop", "joins")

    def __init__(self, iterator: Any, loader: Any, prior_training: bool, driven: bool) -> None:
        self.iterator = weakref.ref(iterator)  # dead once the program dropped it (a peek)
        self.loader = loader  # what every iterator of one DataLoader shares (its sampler)
        self.role = DRIVEN if driven else UNKNOWN
        self.batches = 0
        # Gradients were on and a model in train mode when it began: how to read a scope or
        # mark made between a fetch and the first work on the batch.
        self.prior_training = prior_training
        self.loop: tuple[Any, int] | None = None  # the `for` that consumed it, once it ran dry
        self.joins = False  # a new loader's pass that joins the open epoch (another loop)

    @property
    def abandoned(self) -> bool:
        """The program dropped its iterator (a peek with ``next(iter(loader))``)."""
        return self.iterator() is None


def _consumer(frame: Any) -> tuple[Any, int] | None:
    """The ``for`` statement that fetches (its code and instruction), from ``frame`` out:
    past cirron's frames and the generators that wrap a loader (a prefetcher)."""
    while frame is not None and frame.f_globals.get("__name__", "").startswith("cirron"):
        frame = frame.f_back
    while frame is not None and frame.f_code.co_flags & _CO_GENERATOR:
        frame = frame.f_back
    return (frame.f_code, frame.f_lasti) if frame is not None else None


def _state() -> Any:
    return (recorder.current or recorder.active()).training


# A forward held until its batch is judged: (attributes, start, end, what it raised).
HeldForward = tuple[dict[str, Any], int, int, BaseException | None]


class TorchLoop(metaclass=hot.Watched):
    """What the hooks have seen of the loop so far (forgotten when the hooks attach).

    Its fields are slots: the compiled step cycle (configured by
    :mod:`cirron.instrumentors.torch`) reads them by offset, and does the work of its methods
    while none of them is replaced (:data:`cirron.recording.hot.patched`)."""

    __slots__ = (
        "has_optimizer",
        "optimizer_steps",
        "epoch_passes",
        "dry",
        "evaluation_pass",
        "training_thread",
        "held",
        "training_now",
    )

    def __init__(self) -> None:
        # Gradients on and a model seen training, now (set by the hooks when they attach).
        self.training_now: Callable[[], bool] = lambda: True
        self.reset()

    def reset(self) -> None:
        """Forget the loop seen so far (the hooks attach anew)."""
        self.has_optimizer = False  # steps end at optimizer steps (else at backwards)
        self.optimizer_steps = 0  # optimizer.step() calls so far (a GradScaler's may skip one)
        self.epoch_passes: list[LoaderPass] = []  # the training passes of the open epoch
        self.dry = False  # one of them ran dry: the epoch's last work may still come
        self.evaluation_pass: LoaderPass | None = None  # the pass of the open evaluation
        self.training_thread: int | None = None  # the thread of the last training work
        self.held: list[HeldForward] = []  # eval forwards on a batch not judged yet

    # -- fetches -------------------------------------------------------------------------------
    def fetch_begins(self, loader_pass: LoaderPass, now: int) -> None:
        """A fetch from ``loader_pass`` begins at ``now``: the step before it is over."""
        if loader_pass.role == DRIVEN:
            return
        if self.held:  # the batch before fed no training work: an evaluation batch
            self._judged_evaluation(sys._getframe(1))
        step = (recorder.current or recorder.active()).training.step  # no call: every batch
        if step is not None and step.owner is TORCH and step.complete:
            training.end_step(TORCH, end_ns=now)
        elif step is None:  # (an epoch's first batch, or an evaluation's: no call at most)
            training.fetch_begins_between_steps(now)
        if self.evaluation_pass is not None and self.evaluation_pass is not loader_pass:
            self.evaluation_pass = None
            training.end_evaluation(TORCH, end_ns=now)
        if loader_pass.batches == 0 and self.epoch_passes and loader_pass.role == UNKNOWN:
            if any(p.loader is loader_pass.loader for p in self.epoch_passes):
                training.epoch_boundary(TORCH)  # a new pass: the model is final for the epoch
            elif self.dry:
                loop = _consumer(sys._getframe(1))
                loader_pass.joins = loop is not None and all(
                    p.loop is not None and p.loop != loop for p in self.epoch_passes
                )
                if not loader_pass.joins:  # the same loop again: a new epoch
                    training.epoch_boundary(TORCH)

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
        if self.held:  # the last batch fed no training work: an evaluation batch
            self._judged_evaluation(sys._getframe(2))
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
        # The loop that consumed the pass: the caller of the fetch hook (__next__, or a
        # subclass's generator), three frames out (fetch_ends, then the hook's guard).
        loader_pass.loop = _consumer(sys._getframe(3))
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
            if self.held:  # the eval forwards before this work: the step's
                step = _state().step
                self.record_held(step.opened[0] if step is not None else None)
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
            else:  # another loader of this epoch's loop (zipped, in turns, or a loop after)
                self.epoch_passes.extend(new)
                self.dry = False
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
        if epoch is None or epoch.owner is not TORCH or epoch.fallback:
            return True
        if self.dry:  # a pass of another loop over a new loader joins the epoch
            return not all(p.joins for p in new)
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

    def evaluation_work(self, frame: Any) -> bool:
        """A forward in eval mode or without gradients (``frame``: the hook's caller); True
        when its span is to be held until its batch is judged (:meth:`hold`)."""
        if self.training_thread is not None and _thread_id() != self.training_thread:
            return False  # another thread's evaluation: the training loop's moments are not its
        if _pending:
            source = _pending[-1].source
            if not isinstance(source, LoaderPass) or not training.may_own(TORCH):
                return False
            if source.role == TRAINING:  # a teacher's forward, say: the batch's step begins
                self._begin_training_step()
            elif source.role == UNKNOWN:
                if source.prior_training or self._may_train_on(source):
                    return True
                self._begin_evaluation(source, frame)
            return False
        step = _state().step
        if step is not None and step.complete:
            training.end_completed_step(TORCH)
        return False

    def _may_train_on(self, source: LoaderPass) -> bool:
        """Could a pass that began with no model training still be a training pass? Before
        any training (a frozen backbone in eval), or over a loader that trained this epoch
        (a model left in eval after validation)."""
        return not self.epoch_passes or any(p.loader is source.loader for p in self.epoch_passes)

    def hold(self, attributes: dict[str, Any], start_ns: int, error: BaseException | None) -> None:
        """A held forward (from ``start_ns`` to now) waits with its batch's fetch."""
        self.held.append((attributes, start_ns, _time_ns(), error))

    def record_held(self, parent: Any) -> None:
        """The held forwards as spans under ``parent`` (None: where the program is)."""
        held, self.held = self.held, []
        if not _state().detail:  # a step kept without its hook spans
            return
        if parent is None:
            parent = current_span()
        for attributes, start_ns, end_ns, error in held:
            hook_spans.record_on(parent, semconv.FORWARD, attributes, start_ns, end_ns, error)

    def _judged_evaluation(self, frame: Any) -> None:
        """The batch with held forwards fed no training work: its pass is an evaluation."""
        source = _pending[-1].source if _pending else None
        if isinstance(source, LoaderPass) and source.role == UNKNOWN:
            self._begin_evaluation(source, frame)
        evaluation = _state().evaluation
        mine = evaluation is not None and evaluation.owner is TORCH
        self.record_held(evaluation.opened[0] if mine else None)  # type: ignore[union-attr]

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
        if self.held:  # eval forwards came first: what is on now judges the batch
            if self.training_now():
                self.training_work()
            else:
                self._judged_evaluation(sys._getframe(2))
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
