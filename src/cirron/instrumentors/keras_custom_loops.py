"""TensorFlow custom training loops: the loop of TensorFlow's guide "writing a training loop
from scratch", traced like a torch loop.

Installed with the Keras instrumentor on the TensorFlow backend. What the
hooks see, and what it becomes:

- a fetch from a ``tf.data.Dataset`` iterator (``for x, y in dataset``) is a
  ``data_load``; a pass over a dataset whose batches feed training work is
  an **epoch**, from the start of its first fetch until the next training
  pass begins;
- the outermost call of a Keras model or layer is a ``forward``, ``mode=train``
  inside a ``tf.GradientTape`` or with ``training=True``, else ``mode=eval``;
- ``tape.gradient`` is the ``backward``; the optimizer's ``apply_gradients``
  (Keras 3 ``apply``) is the ``optimizer_step`` that completes the **step**,
  which runs from its batch's fetch to the next step's fetch;
- a pass whose batches feed evaluation forwards is a ``validate`` pass inside
  the training epoch (``evaluate`` outside one), ending when its dataset runs
  dry or training resumes.

**Compiled steps.** Under ``@tf.function`` the Python hooks run only while
TensorFlow traces the function (its first call for each input signature).
What the trace saw tells what the function is: one that applied an optimizer
is a training step, one that called a model without a tape an evaluation
step. Each later call is then that step (or evaluation batch) as a whole:
its ``data_load`` and its time, with no ``forward``/``backward``/
``optimizer_step`` inside (they run in TensorFlow's graph, where no Python
hook can see them). A loop compiled whole (the dataset iterated inside the
``tf.function``) shows as its calls only.

Inside ``fit``/``evaluate``/``predict`` Keras's callback owns the moments and
these hooks record nothing. This module imports TensorFlow only when the
program has (Keras on TensorFlow imports it).
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from .. import training
from ..otel import semconv
from ..recording import hook_spans, recorder, training_state
from ..recording.guard import guarded
from ..recording.scopes import current_span
from ..recording.training_state import Fetch
from ..training import loop_frames
from . import around

SITE = "tensorflow hook"
OWNER = training.owner("tensorflow")
# Frames that are not the user's loop: TensorFlow's, Keras's, and cirron's.
_NOT_THE_USERS = ("tensorflow", "keras", "tf_keras", "cirron")
UNKNOWN, TRAINING, EVALUATION = range(3)
TRAIN_STEP, EVALUATION_STEP = "train", "eval"  # what a traced tf.function turned out to be
_PASS = "_cirron_pass"
MAX_WAITING = 64  # fetches that wait for work at most; older ones are recorded where they are
_pending = training_state.pending_fetches  # mutated in place, never rebound


class DatasetPass:
    """One pass of one dataset iterator: what its batches fed."""

    __slots__ = ("iterator", "role", "__weakref__")

    def __init__(self, iterator: Any) -> None:
        self.iterator = weakref.ref(iterator)
        self.role = UNKNOWN

    @property
    def abandoned(self) -> bool:
        return self.iterator() is None


class TensorFlowLoop:
    """What the hooks have seen of the loop (forgotten when they attach)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.evaluation_pass: DatasetPass | None = None
        self.tapes = 0  # GradientTapes recording now
        self.inside_call = False  # an outermost layer call runs
        self.inside_apply = False  # an optimizer's apply runs (apply_gradients calls apply)
        self.tracing: list[set[str]] = []  # what each tf.function being traced saw
        # Eval forwards on the first batch of a pass, held until the batch's work says what
        # they were: (attributes, start, end, what they raised).
        self.held: list[tuple[dict[str, Any], int, int, BaseException | None]] = []

    # -- fetches -------------------------------------------------------------------------------
    def fetch_begins(self, source: DatasetPass, now: int) -> None:
        if self.held:  # the batch before fed no training work: an evaluation batch
            self._judged_evaluation(sys._getframe(1))
        step = training.step_of(OWNER)
        if step is not None and step.complete:
            training.end_step(OWNER, end_ns=now)
        elif step is None:  # the step this batch feeds is measured from its fetch
            training.fetch_begins_between_steps(now)
        if self.evaluation_pass is not None and self.evaluation_pass is not source:
            self.evaluation_pass = None
            training.end_evaluation(OWNER, end_ns=now)

    def fetch_ends(self, source: DatasetPass, fetch: Fetch, dry: bool) -> None:
        if dry and self.held:
            self._judged_evaluation(sys._getframe(1))
        evaluation = training.state().evaluation
        if source is self.evaluation_pass and evaluation is not None:
            training.record_fetches([fetch], evaluation.opened[0])
            if dry:
                self.evaluation_pass = None
                training.end_evaluation(OWNER)
            else:
                evaluation.batches += 1
            return
        if not dry:
            _pending.append(fetch)
            if len(_pending) > MAX_WAITING:  # a loop that does no work of ours with its batches
                waiting = training.take_fetches()
                training.record_fetches(waiting[:-1])
                _pending.append(waiting[-1])
            return
        waiting = training.take_fetches() + [fetch]
        epoch = training.epoch_of(OWNER)
        if source.role == TRAINING and epoch is not None:
            training.record_fetches(waiting, epoch.opened[0])  # the epoch's: its loop ran dry
        else:
            training.record_fetches(waiting)

    # -- the work ------------------------------------------------------------------------------
    def training_work(self) -> None:
        """A training forward, ``tape.gradient``, an optimizer step, or a compiled one."""
        for seen in self.tracing:
            seen.add(TRAIN_STEP)
        if self.evaluation_pass is not None:
            self.evaluation_pass = None
            training.end_evaluation(OWNER)
        fetches = training.fed(training.take_fetches())
        step = training.step_of(OWNER)
        if fetches:
            source = fetches[-1].source
            if source.role != TRAINING:  # a new pass trained on: the next epoch begins
                source.role = TRAINING
                training.begin_epoch(OWNER, start_ns=fetches[0].start_ns)
            if step is not None and not step.complete:
                training.record_fetches(fetches, step.opened[0])
            else:
                training.begin_step(OWNER, fetches=fetches)
            if self.held:  # the eval forwards before this work: the step's
                step = training.step_of(OWNER)
                self.record_held(step.opened[0] if step is not None else None)
        elif step is None or step.complete:  # no dataset: a step at the first work after one
            training.begin_step(OWNER, fallback_epoch=training.epoch_of(OWNER) is None)

    def evaluation_work(self, frame: Any, may_hold: bool) -> bool:
        """A model called outside a tape (``may_hold``), or a compiled evaluation step; True
        when the forward's span is to be held until its batch is judged."""
        for seen in self.tracing:
            seen.add(EVALUATION_STEP)
        if not _pending:
            return False
        source = _pending[-1].source
        if not isinstance(source, DatasetPass) or source.role == EVALUATION:
            return False
        if source.role == TRAINING:  # a later batch of a training pass: its step begins here
            self.training_work()
            return False
        if may_hold and not self.tracing:  # a teacher's call before the update, say
            return True
        self._begin_evaluation(source, frame)
        return False

    def _judged_evaluation(self, frame: Any) -> None:
        """The batch with held forwards fed no training work: its pass is an evaluation."""
        source = _pending[-1].source if _pending else None
        if isinstance(source, DatasetPass) and source.role == UNKNOWN:
            self._begin_evaluation(source, frame)
        evaluation = training.state().evaluation
        mine = evaluation is not None and evaluation.owner is OWNER
        self.record_held(evaluation.opened[0] if mine else None)  # type: ignore[union-attr]

    def record_held(self, parent: Any) -> None:
        """The held forwards as spans under ``parent`` (None: where the program is)."""
        held, self.held = self.held, []
        parent = parent if parent is not None else current_span()
        for attributes, start_ns, end_ns, error in held:
            hook_spans.record_on(parent, semconv.FORWARD, attributes, start_ns, end_ns, error)

    def _begin_evaluation(self, source: DatasetPass, frame: Any) -> None:
        fetches = training.fed(training.take_fetches())
        loop = loop_frames.position(frame, _NOT_THE_USERS)
        if training.begin_evaluation(OWNER, fetches=fetches, loop=loop) is not None:
            source.role = EVALUATION
            self.evaluation_pass = source

    def optimizer_stepped(self, frame: Any) -> None:
        training.complete_step(OWNER, loop_frames.position(frame, _NOT_THE_USERS))


LOOP = TensorFlowLoop()


def ours() -> bool:
    """May the hooks report now: profiling, and not inside Keras's fit/evaluate/predict."""
    if recorder.current is None or not recorder.current.enabled:
        return False
    return training.may_own(OWNER) and OWNER not in training.state().holders


# -- the hooks -----------------------------------------------------------------------------------
def make_next(original: Any) -> Any:
    """Our ``OwnedIterator.__next__``: each fetch from a dataset, timed."""
    begins = guarded(SITE)(LOOP.fetch_begins)
    ends = guarded(SITE)(_fetched)

    def __next__(self: Any) -> Any:
        if not ours():
            return original(self)
        source = self.__dict__.get(_PASS)
        if source is None:
            source = self.__dict__[_PASS] = DatasetPass(self)
        started = time.time_ns()
        begins(source, started)
        try:
            item = original(self)
        except StopIteration:
            ends(source, started, None, True)
            raise
        except Exception as error:
            ends(source, started, error, False)
            raise
        ends(source, started, None, False)
        return item

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    return __next__


def _fetched(source: DatasetPass, started: int, error: BaseException | None, dry: bool) -> None:
    LOOP.fetch_ends(source, Fetch(started, time.time_ns(), error, source), dry)


def _forward_begins(layer: Any, args: Any, kwargs: Any) -> Any:
    if LOOP.inside_call or not ours():
        return None
    training_call = kwargs.get("training")
    train = bool(training_call) if training_call is not None else LOOP.tapes > 0
    mode = semconv.MODE_TRAIN if train else semconv.MODE_EVAL
    attributes = {semconv.MODE: mode, semconv.MODULE: type(layer).__name__}
    token: Any = None
    if train:
        LOOP.training_work()
    elif LOOP.evaluation_work(sys._getframe(1), may_hold=True):
        token = (attributes, time.time_ns())  # held: recorded once its batch is judged
    if token is None:
        token = hook_spans.begin(semconv.FORWARD, attributes) or True
    LOOP.inside_call = True  # (set last: a failure above leaves no flag set for good)
    return token


def _forward_ends(token: Any, error: BaseException | None) -> None:
    LOOP.inside_call = False
    if type(token) is tuple:
        LOOP.held.append((token[0], token[1], time.time_ns(), error))
    elif token is not True:
        hook_spans.end(token, error)


def _gradient_begins(tape: Any, args: Any, kwargs: Any) -> Any:
    if not ours():
        return None
    LOOP.training_work()
    return hook_spans.begin(semconv.BACKWARD, {}) or True


def _apply_begins(optimizer: Any, args: Any, kwargs: Any) -> Any:
    if LOOP.inside_apply or not ours():
        return None
    LOOP.training_work()
    token = hook_spans.begin(semconv.OPTIMIZER_STEP, {}) or True
    LOOP.inside_apply = True  # (set last: a failure above leaves no flag set for good)
    return token


def _apply_ends(token: Any, error: BaseException | None) -> None:
    LOOP.inside_apply = False
    _span_ends(token, error)
    if error is None:
        LOOP.optimizer_stepped(sys._getframe(1))


def _span_ends(token: Any, error: BaseException | None) -> None:
    if token is not True:
        hook_spans.end(token, error)


def _tape_enters(tape: Any, args: Any, kwargs: Any) -> Any:
    LOOP.tapes += 1
    return True


def _tape_exits(token: Any, error: BaseException | None) -> None:
    LOOP.tapes = max(0, LOOP.tapes - 1)


def _function_begins(function: Any, args: Any, kwargs: Any) -> Any:
    """A ``tf.function`` call: a compiled step once its trace said so; else watch the trace."""
    if LOOP.tracing or LOOP.inside_call or not ours():
        return None  # (a function inside one being traced or called: part of it)
    kind = function.__dict__.get("_cirron_kind")
    if kind == TRAIN_STEP:
        LOOP.training_work()
        return TRAIN_STEP
    if kind == EVALUATION_STEP:
        LOOP.evaluation_work(sys._getframe(1), may_hold=False)
        return None
    if kind is None:
        seen: set[str] = set()
        LOOP.tracing.append(seen)
        return (function, seen)
    return None


def _function_ends(token: Any, error: BaseException | None) -> None:
    if token == TRAIN_STEP:
        if error is None:
            LOOP.optimizer_stepped(sys._getframe(1))
        else:
            training.end_step(OWNER, error)
        return
    function, seen = token
    if LOOP.tracing and LOOP.tracing[-1] is seen:
        LOOP.tracing.pop()
    if TRAIN_STEP in seen:
        function.__dict__["_cirron_kind"] = TRAIN_STEP
    elif EVALUATION_STEP in seen:
        function.__dict__["_cirron_kind"] = EVALUATION_STEP
    elif error is None:
        function.__dict__["_cirron_kind"] = "other"


def install(instrumentor: Any, tensorflow: Any, keras: Any) -> None:
    """Patch what a TensorFlow custom loop calls (``instrumentor.wrap``/``patch``)."""
    LOOP.reset()
    from tensorflow.python.data.ops.iterator_ops import OwnedIterator
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import Function

    def wrap(owner: Any, name: str, begin: Any, end: Any = None) -> None:
        instrumentor.patch(owner, name, around(SITE, owner.__dict__[name], begin, end))

    instrumentor.patch(OwnedIterator, "__next__", make_next(OwnedIterator.__dict__["__next__"]))
    layer = next(klass for klass in keras.Layer.__mro__ if "__call__" in klass.__dict__)
    wrap(layer, "__call__", _forward_begins, _forward_ends)
    tape = tensorflow.GradientTape
    wrap(tape, "__enter__", _tape_enters)
    wrap(tape, "__exit__", lambda *_: True, _tape_exits)
    wrap(tape, "gradient", _gradient_begins, _span_ends)
    optimizer = next(k for k in keras.optimizers.Optimizer.__mro__ if "apply" in k.__dict__)
    wrap(optimizer, "apply", _apply_begins, _apply_ends)
    wrap(Function, "__call__", _function_begins, _function_ends)


def end_moments() -> None:
    """The hooks come off: what a custom loop left open ends."""
    LOOP.record_held(None)
    training.record_fetches(training.take_fetches())
    training.end_evaluation(OWNER)
    training.end_step(OWNER)
    training.end_epoch(OWNER)
    LOOP.reset()
