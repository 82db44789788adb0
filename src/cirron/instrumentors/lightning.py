"""PyTorch Lightning instrumentation: a ``Callback`` that reports a ``Trainer``'s moments.

Installed by ``ci.profile()`` once the script imports ``lightning`` or
``pytorch_lightning`` (2.x), or on its own with plain OpenTelemetry
(``LightningInstrumentor().instrument(tracer_provider=...)``). Every
``Trainer`` gets one cirron callback appended to its callbacks when it is
built. What becomes a span:

- ``train``: one ``trainer.fit()``, set-up included.
- ``epoch`` (Lightning's ``current_epoch``) and ``step`` (one per optimizer
  step, indexed by ``trainer.global_step``: its batches under
  ``accumulate_grad_batches`` are inside it), owned by Lightning: the torch
  hooks yield them and keep their ``forward``/``backward``/``optimizer_step``
  inside the step. An epoch stays open after ``on_train_epoch_end`` until
  Lightning has logged its epoch-level values (it logs them after that hook).
- ``validate``: the validation loop during ``fit``, inside its epoch (never
  inside a step), with the epoch's ``index`` and ``batches``; the sanity
  check before training is one too, with ``sanity_check`` true, before the
  first epoch. ``trainer.validate()``, ``test()`` and ``predict()`` are
  ``evaluate``, ``test`` and ``predict`` spans with ``batches``.
- ``checkpoint``: a ``trainer.save_checkpoint`` (``ModelCheckpoint`` saves
  through it), with its ``path``.
- ``self.log(...)`` values, as Lightning hands them to its loggers (every
  ``log_every_n_steps`` steps, and at epoch ends): step-level values are
  point marks on the step they were logged in; epoch-level values summary
  marks on the epoch; an evaluation's values summary marks on its span (and,
  for validation during ``fit``, on the epoch too). The values are read when
  Lightning logs them, so nothing is read from the GPU more often than
  Lightning does.
- The ``LightningModule`` is watched for snapshots with no ``ci.watch``: one
  per epoch, at ``on_train_epoch_end``, gradients of the last step included.

An exception in a run (``on_exception``) ends its spans with the error
recorded. Every callback runs behind the guard. ``uninstrument()`` restores
every patched method; callbacks already added to trainers go quiet.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import training
from ..guard import guarded
from ..scopes import close_span, marks_from, open_span
from ..training_state import Moment
from ..watch import register as watch_model
from . import FrameworkInstrumentor

_SITE = "lightning hook"
LIGHTNING = training.owner("lightning")
_active = [False]  # the instrumentor is on: callbacks of trainers built earlier go quiet
_callbacks: dict[str, Any] = {}  # module ("lightning", "pytorch_lightning") -> callback class


class LightningRun:
    """What one trainer's callback knows of the run it is in."""

    __slots__ = ("train", "passes", "epoch_ending", "step_began_at")

    def __init__(self) -> None:
        self.train: Any = None  # the open `train` span of trainer.fit()
        self.passes: list[Moment] = []  # open validate/evaluate/test/predict
        self.epoch_ending = False  # on_train_epoch_end was called: logs now describe the epoch
        self.step_began_at = -1  # trainer.global_step when the open step began


# -- fit, epochs and steps ----------------------------------------------------------------------
@guarded(_SITE)
def _open_train(run: LightningRun) -> None:
    if run.train is None:
        training.take_over(LIGHTNING)
        run.train = open_span("train", {})


@guarded(_SITE)
def _fit_start(run: LightningRun, trainer: Any, module: Any) -> None:
    if run.train is None:
        _open_train(run)
    if run.train is not None:
        run.train[0].set_attribute("max_epochs", int(trainer.max_epochs or -1))
        run.train[0].set_attribute("accumulate_grad_batches", int(trainer.accumulate_grad_batches))
    if module is not None:
        watch_model(module)


@guarded(_SITE)
def _close_train(run: LightningRun, error: BaseException | None = None) -> None:
    training.release(LIGHTNING)
    while run.passes:
        _end_pass(run, error)
    training.end_epoch(LIGHTNING, error)
    training.end_step(LIGHTNING, error)
    train, run.train = run.train, None
    if train is not None:
        close_span(train, error)


@guarded(_SITE)
def _epoch_start(run: LightningRun, trainer: Any) -> None:
    run.epoch_ending = False
    training.begin_epoch(LIGHTNING, index=int(trainer.current_epoch))


@guarded(_SITE)
def _epoch_end(run: LightningRun) -> None:
    run.epoch_ending = True
    training.end_step(LIGHTNING)
    training.epoch_boundary(LIGHTNING)  # the model is final for the epoch: snapshots now


@guarded(_SITE)
def _batch_start(run: LightningRun, trainer: Any) -> None:
    step = training.step_of(LIGHTNING)
    if step is None or step.complete:  # else: a batch accumulating into the open step
        run.step_began_at = int(trainer.global_step)
        training.begin_step(LIGHTNING, index=run.step_began_at)


@guarded(_SITE)
def _batch_end(run: LightningRun, trainer: Any) -> None:
    if int(trainer.global_step) > run.step_began_at:  # the optimizer stepped: its work is done
        training.complete_step(LIGHTNING)


# -- evaluation passes --------------------------------------------------------------------------
@guarded(_SITE)
def _pass_start(run: LightningRun, trainer: Any, name: str) -> None:
    attributes: dict[str, Any] = {}
    if run.train is not None and name == "evaluate":  # validation during fit
        name = "validate"
        if trainer.sanity_checking:
            attributes["sanity_check"] = True
        else:
            training.end_completed_step(LIGHTNING)  # never inside a step
            epoch = training.epoch_of(LIGHTNING)
            if epoch is not None:
                attributes["index"] = epoch.index
    elif run.train is None:
        training.take_over(LIGHTNING)
    moment = training.begin_pass(LIGHTNING, name, attributes)
    if moment is not None:
        run.passes.append(moment)


@guarded(_SITE)
def _pass_batch(run: LightningRun) -> None:
    if run.passes:
        run.passes[-1].batches += 1


def _end_pass(run: LightningRun, error: BaseException | None = None) -> None:
    training.end_pass(LIGHTNING, run.passes.pop(), error)


_pass_end = guarded(_SITE)(_end_pass)


# -- what Lightning logs ----------------------------------------------------------------------
@guarded(_SITE)
def _logged(trainer: Any, metrics: Any) -> None:
    run = _run_of(trainer)
    if run is None or not metrics:
        return
    if run.passes:  # an evaluation's epoch-end values
        opened = run.passes[-1].opened[0]
        marks_from(opened, metrics, "summary")
        epoch = training.epoch_of(LIGHTNING)
        if epoch is not None and opened.name == "validate" and not trainer.sanity_checking:
            marks_from(epoch.opened[0], metrics, "summary")
        return
    training.logged(LIGHTNING, metrics, run.epoch_ending)


def _make_callback_class(base: Any) -> Any:
    class CirronCallback(base):  # type: ignore[misc, valid-type]
        """cirron's callback: reports the Trainer's moments (see the module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self.run = LightningRun()

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            if _active[0]:
                _fit_start(self.run, trainer, pl_module)

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if _active[0]:
                _epoch_start(self.run, trainer)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if _active[0]:
                _batch_start(self.run, trainer)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if _active[0]:
                _batch_end(self.run, trainer)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if _active[0]:
                _epoch_end(self.run)

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if _active[0]:
                _pass_start(self.run, trainer, "evaluate")

        def on_test_start(self, trainer: Any, pl_module: Any) -> None:
            if _active[0]:
                _pass_start(self.run, trainer, "test")

        def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
            if _active[0]:
                _pass_start(self.run, trainer, "predict")

        def on_validation_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if _active[0]:
                _pass_batch(self.run)

        on_test_batch_end = on_validation_batch_end
        on_predict_batch_end = on_validation_batch_end

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if _active[0] and self.run.passes:
                _pass_end(self.run)

        on_test_end = on_validation_end
        on_predict_end = on_validation_end

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if _active[0]:
                _close_train(self.run, exception)

    return CirronCallback


def _run_of(trainer: Any, add: bool = False) -> LightningRun | None:
    """The run of ``trainer``'s cirron callback (``add``: give it one if it has none)."""
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, list):
        return None
    classes = tuple(_callbacks.values())
    for callback in callbacks:
        if isinstance(callback, classes):
            return callback.run  # type: ignore[no-any-return]
    if not add:
        return None
    module = type(trainer).__module__.split(".")[0]
    cls = _callbacks.get(module) or next(iter(_callbacks.values()))
    callback = cls()
    callbacks.append(callback)
    return callback.run  # type: ignore[no-any-return]


# -- patched Trainer methods ----------------------------------------------------------------------
def _built(trainer: Any, args: Any, kwargs: Any) -> Any:
    """``Trainer.__init__``: once it has run, the trainer gets its callback."""
    return trainer if _active[0] else None


def _add_callback(trainer: Any, error: BaseException | None) -> None:
    if error is None:
        _run_of(trainer, add=True)


def _fit_begins(trainer: Any, args: Any, kwargs: Any) -> LightningRun | None:
    """``fit()``: a trainer built before the instrumentor gets its callback; ``train`` opens."""
    run = _run_of(trainer, add=True) if _active[0] else None
    if run is not None:
        training.hold(LIGHTNING)  # its loop has the moments: the torch hooks open none meanwhile
        _open_train(run)
    return run


def _entry(trainer: Any, args: Any, kwargs: Any) -> None:
    """``validate``/``test``/``predict``: a trainer built earlier gets its callback first."""
    if _active[0]:
        _run_of(trainer, add=True)


def _checkpoint_begins(trainer: Any, args: Any, kwargs: Any) -> Any:
    filepath = args[0] if args else kwargs.get("filepath")
    if not _active[0] or filepath is None:
        return None
    return open_span("checkpoint", {"path": os.path.abspath(os.fspath(filepath))})


def _logs(connector: Any, args: Any, kwargs: Any) -> None:
    """``_LoggerConnector.log_metrics``: what Lightning hands its loggers."""
    metrics = args[0] if args else kwargs.get("metrics")
    if _active[0]:
        _logged(connector.trainer, metrics)


class LightningInstrumentor(FrameworkInstrumentor):
    """OpenTelemetry instrumentor for PyTorch Lightning 2.x (see the module docstring)."""

    framework = "lightning"
    site = _SITE

    def install(self, module: str) -> None:
        package = sys.modules[module]
        pl = package.pytorch if module == "lightning" else package
        from importlib import import_module

        connectors = import_module(f"{pl.__name__}.trainer.connectors.logger_connector")
        if module not in _callbacks:  # one class per module, kept: callbacks outlive a cycle
            _callbacks[module] = _make_callback_class(pl.Callback)

        self.wrap(pl.Trainer, "__init__", _built, _add_callback)
        self.wrap(pl.Trainer, "fit", _fit_begins, _close_train)
        for name in ("validate", "test", "predict"):
            self.wrap(pl.Trainer, name, _entry)
        self.wrap(pl.Trainer, "save_checkpoint", _checkpoint_begins, close_span)
        # What Lightning hands its loggers: the one place that knows a value's level.
        self.wrap(connectors._LoggerConnector, "log_metrics", _logs)
        _active[0] = True

    def remove(self) -> None:
        _active[0] = False
