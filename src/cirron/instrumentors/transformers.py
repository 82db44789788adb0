"""HuggingFace ``Trainer`` instrumentation: a ``TrainerCallback`` that reports training moments.

Installed by ``ci.profile()`` once the script imports transformers, or on its
own with plain OpenTelemetry::

    from cirron.instrumentors.transformers import TransformersInstrumentor
    TransformersInstrumentor().instrument(tracer_provider=provider)

Every ``Trainer`` (``Seq2SeqTrainer``, a user's subclass) gets one cirron
callback, beside the user's, when it is built (or when it trains, for one
built before the instrumentor). What becomes a span:

- ``train``: one ``trainer.train()``; its final metrics (``train_loss``,
  ``train_runtime``, ...) are summary marks on it.
- ``epoch`` and ``step``, owned by the Trainer (the torch hooks yield them and
  keep their ``forward``/``backward``/``optimizer_step``/``data_load`` inside):
  one ``step`` per optimizer step, indexed by HF's global step (so a resumed
  run goes on from its checkpoint); epochs indexed by HF's epoch. The Trainer
  fetches a step's batches (all of them, under gradient accumulation) before
  ``on_step_begin``: the step begins where that fetch begins
  (``Trainer.get_batch_samples``), so its ``data_load`` spans are inside it.
- ``validate`` (evaluation during training, inside its epoch, never inside a
  step), ``evaluate`` (``trainer.evaluate()`` on its own) and ``predict``,
  each with ``batches``; ``checkpoint`` with ``path`` for a checkpoint save.
- Logged values (``on_log``): during an epoch, point marks on the step they
  describe; logged after the epoch's last step (the Trainer logs and evaluates
  after ``on_epoch_end``, so the epoch stays open until then), summary marks on
  the epoch; evaluation metrics (``eval_*``) summary marks on their
  ``validate``/``evaluate`` span, and on the epoch at an epoch's end.
- The model is watched for snapshots with no ``ci.watch``; its snapshot is
  taken at the epoch's last optimizer step, before the Trainer clears the
  gradients, so it has weights and gradients.

A ``train()`` that raises ends its step, epoch and ``train`` span with the
error recorded; the error reaches the user unchanged. ``model.generate()`` and
text-generation pipelines are LLM calls, with the GenAI conventions'
attributes: :mod:`.transformers_generate`, installed with these hooks.
Every callback runs behind the core guard: a failure inside cirron is counted
in ``ci.health()`` and training goes on. ``uninstrument()`` restores every
patched ``Trainer`` method; callbacks already added to trainers go quiet.
This module imports transformers only when it instruments.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from typing import Any

from .. import training
from ..otel import semconv
from ..recording import recorder
from ..recording.guard import guarded
from ..snapshots.watch import watch_for_run
from ..training.callbacks import FrameworkRun, Switch
from . import FrameworkInstrumentor, transformers_generate

_SITE = "transformers hook"
HF = training.owner("transformers")
ACTIVE = Switch()  # the instrumentor is on: callbacks of trainers built earlier go quiet
_callback_class: list[Any] = [None]  # made on first use: it subclasses transformers' class


class TrainerRun(FrameworkRun):
    """What one trainer's callback knows of its run (one per trainer)."""

    def __init__(self) -> None:
        super().__init__(HF, _SITE)
        self.updates_left: int | None = None  # optimizer steps left in this epoch
        self.last_epoch: int | None = None  # the index of this train()'s latest epoch


# -- the callback's moments -------------------------------------------------------------------
@guarded(_SITE)
def _train_begin(run: TrainerRun, args: Any, state: Any, model: Any) -> None:
    # The epochs it will run: max_steps may say otherwise than the argument (the Trainer
    # works it out before on_train_begin; an iterable dataset's count is unknown).
    epochs = getattr(state, "num_train_epochs", 0)
    if not isinstance(epochs, int) or not 0 < epochs < sys.maxsize:
        epochs = args.num_train_epochs
    attributes = {
        semconv.NUM_TRAIN_EPOCHS: float(epochs),
        semconv.MAX_STEPS: int(state.max_steps or 0),
        semconv.GRADIENT_ACCUMULATION_STEPS: int(args.gradient_accumulation_steps),
    }
    run.begin(attributes, hold=False)  # (train() holds the levels, from before this moment)
    run.last_epoch = None
    if model is not None:
        run.watching(watch_for_run(model))


@guarded(_SITE)
def _epoch_begin(run: TrainerRun, args: Any, state: Any, dataloader: Any) -> None:
    # The Trainer's epoch is its progress (1.5 when resumed half way through epoch 1); over an
    # iterable dataset of unknown length it is not even that (0.67 after a whole pass).
    index = int(state.epoch or 0)
    if run.last_epoch is not None:
        index = max(index, run.last_epoch + 1)
    run.last_epoch = index
    run.begin_epoch(index)
    run.updates_left = _updates_left(args, state, dataloader)


def _updates_left(args: Any, state: Any, dataloader: Any) -> int | None:
    """Optimizer steps this epoch will make (its last one is the epoch's boundary)."""
    try:
        batches = len(dataloader)
    except TypeError:  # an iterable dataset: no length, the boundary is the epoch's end
        return None
    accumulation = max(int(args.gradient_accumulation_steps), 1)
    per_epoch = max(math.ceil(batches / accumulation), 1)
    left = per_epoch - state.global_step % per_epoch  # a resumed epoch has done some
    if state.max_steps and state.max_steps > 0:
        left = min(left, state.max_steps - state.global_step)
    return left


@guarded(_SITE)
def _step_begin(run: TrainerRun, state: Any) -> None:
    step = training.step_of(HF)
    if step is None or step.complete:  # else get_batch_samples began it
        run.begin_step(state.global_step)


@guarded(_SITE)
def _optimizer_step(run: TrainerRun) -> None:
    if run.updates_left is not None:
        run.updates_left -= 1
        if run.updates_left <= 0:  # the model is final for the epoch, gradients still there
            training.epoch_boundary(HF)


@guarded(_SITE)
def _log(run: TrainerRun, logs: dict[str, Any]) -> None:
    if "train_runtime" in logs:  # the final metrics of train()
        training.end_epoch(HF)
        run.mark_run(logs)
    elif run.passes:  # metrics of the evaluation running now (on the epoch, at its end)
        run.mark_pass(logs, on_epoch=run.epoch_ending)
    else:
        run.logged(logs)


def _make_callback_class() -> Any:
    from transformers import TrainerCallback

    class CirronCallback(TrainerCallback):  # type: ignore[misc]
        """cirron's callback: reports the Trainer's moments (see the module docstring)."""

        def __init__(self) -> None:
            self.run = TrainerRun()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                _train_begin(self.run, args, state, kwargs.get("model"))

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                _epoch_begin(self.run, args, state, kwargs.get("train_dataloader"))

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                _step_begin(self.run, state)

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                _optimizer_step(self.run)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                self.run.complete_step()  # open for the logs that follow it

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                self.run.epoch_ends()

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if ACTIVE and logs:
                _log(self.run, logs)

        def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                self.run.count_batch()

        def on_predict(
            self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
        ) -> None:
            if ACTIVE and metrics:
                self.run.mark_pass(metrics)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if ACTIVE:
                self.run.end()

    return CirronCallback


def callback_class() -> Any:
    if _callback_class[0] is None:
        _callback_class[0] = _make_callback_class()
    return _callback_class[0]


def _run_of(trainer: Any, add: bool = False) -> TrainerRun | None:
    """The run of ``trainer``'s cirron callback (``add``: give it one if it has none)."""
    handler = getattr(trainer, "callback_handler", None)
    if handler is None:
        return None
    cls = callback_class()
    for callback in handler.callbacks:
        if isinstance(callback, cls):
            return callback.run  # type: ignore[no-any-return]
    if not add:
        return None
    callback = cls()
    handler.add_callback(callback)
    return callback.run  # type: ignore[no-any-return]


# -- evaluation, prediction and checkpoints: spans around Trainer methods -----------------------
def _begin_pass(name: str, describe: Any) -> Any:
    """``begin`` for :func:`around`: the call runs inside a ``name`` span (``validate`` when
    it is an evaluation during training). ``describe(trainer, args, kwargs)`` gives its
    attributes."""

    def begin(trainer: Any, args: Any, kwargs: dict[str, Any]) -> TrainerRun | None:
        run = _run_of(trainer, add=True) if ACTIVE else None
        if run is None:
            return None
        return run if run.begin_pass(name, describe(trainer, args, kwargs)) is not None else None

    return begin


def _end_pass(run: TrainerRun, error: BaseException | None) -> None:
    run.end_pass(error)


def _pass_attributes(trainer: Any, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    prefix = kwargs.get("metric_key_prefix")
    return {semconv.METRIC_KEY_PREFIX: prefix} if isinstance(prefix, str) else {}


def _checkpoint_attributes(trainer: Any, args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    trial = args[1] if len(args) > 1 else kwargs.get("trial")
    folder = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    return {
        semconv.PATH: os.path.abspath(os.path.join(trainer._get_output_dir(trial=trial), folder))
    }


def make_get_batch_samples(original: Any) -> Any:
    """``Trainer.get_batch_samples``: the Trainer fetches a step's batches before
    ``on_step_begin``; the step begins where that fetch began."""

    def get_batch_samples(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.time_ns()
        _fetch_step(self, started)
        result = original(self, *args, **kwargs)
        _fetch_step(self, started, result)
        return result

    return functools.update_wrapper(get_batch_samples, original)


@guarded(_SITE)
def _fetch_step(trainer: Any, started: int, fetched: Any = None) -> None:
    """The step the fetch that began at ``started`` is for begins there: before the fetch
    (``fetched`` None) from a loader of known length, whose every fetch brings the step's
    batches, so that what the fetch records is the step's; after it (``fetched``: what it
    returned) from a stream of unknown length, once it brought batches: the fetch that finds
    the stream dry brings none, and is no step."""
    run = _run_of(trainer) if ACTIVE else None
    if run is None or not run.training:
        return
    if fetched is None:
        if run.updates_left is None:  # a stream: wait for what the fetch brings
            return
    else:
        batches = fetched[0] if isinstance(fetched, tuple) and fetched else None
        if isinstance(batches, list) and not batches:  # the stream ran dry
            return
    step = training.step_of(HF)
    if step is None or step.complete:
        run.begin_step(trainer.state.global_step, start_ns=started)


def _built(trainer: Any, args: Any, kwargs: Any) -> Any:
    """``Trainer.__init__``: once it has run, the trainer gets its callback."""
    return trainer if ACTIVE else None


def _add_callback(trainer: Any, error: BaseException | None) -> None:
    if error is None:
        _run_of(trainer, add=True)


def _train_begins(trainer: Any, args: Any, kwargs: Any) -> Any:
    """``train()``: a trainer built before the instrumentor gets its callback now; its loop
    has the training moments (the torch hooks open none while it runs)."""
    if not ACTIVE or _run_of(trainer, add=True) is None:
        return None
    training.hold(HF)
    return trainer


def _train_ends(trainer: Any, error: BaseException | None) -> None:
    """``train()`` returned, or raised: then what it opened ends with the error recorded."""
    training.release(HF)
    run = _run_of(trainer)
    if error is not None and run is not None:
        run.end(error)


class TransformersInstrumentor(FrameworkInstrumentor):
    """OpenTelemetry instrumentor for the HuggingFace ``Trainer`` (see the module docstring), and
    for LLM generation: ``model.generate()`` and text-generation pipelines as GenAI spans
    (:mod:`cirron.instrumentors.transformers_generate`)."""

    framework = "transformers"
    site = _SITE

    def install(self, module: str) -> None:
        from transformers import Trainer

        self.wrap(Trainer, "__init__", _built, _add_callback)
        self.wrap(Trainer, "train", _train_begins, _train_ends)
        for name in ("evaluate", "predict"):
            self.wrap(Trainer, name, _begin_pass(name, _pass_attributes), _end_pass)
        if "get_batch_samples" in Trainer.__dict__:  # transformers 4.46 and newer
            original = Trainer.__dict__["get_batch_samples"]
            self.patch(Trainer, "get_batch_samples", make_get_batch_samples(original))
        if "_save_checkpoint" in Trainer.__dict__:
            self.wrap(
                Trainer,
                "_save_checkpoint",
                _begin_pass(semconv.CHECKPOINT, _checkpoint_attributes),
                _end_pass,
            )
        transformers_generate.install(self)  # model.generate() and text-generation pipelines
        ACTIVE.on = True

    def remove(self) -> None:
        ACTIVE.on = False
        if recorder.current is not None:
            guarded(_SITE)(training.end_epoch)(HF)
