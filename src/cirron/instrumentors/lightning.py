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
from ..otel import semconv
from ..recording.guard import guarded
from ..recording.scopes import close_span, open_span
from ..snapshots.watch import watch_for_run
from ..training.callbacks import FrameworkRun, Switch
from . import FrameworkInstrumentor

_SITE = "lightning hook"
LIGHTNING = training.owner("lightning")
ACTIVE = Switch()  # the instrumentor is on: callbacks of trainers built earlier go quiet
_callbacks: dict[str, Any] = {}  # module ("lightning", "pytorch_lightning") -> callback class


class LightningRun(FrameworkRun):
    """What one trainer's callback knows of the run it is in."""

    def __init__(self) -> None:
        super().__init__(LIGHTNING, _SITE)
        self.step_began_at = -1  # trainer.global_step when the open step began


@guarded(_SITE)
def _fit_start(run: LightningRun, trainer: Any, module: Any) -> None:
    run.begin()
    run.describe(
        {
            semconv.MAX_EPOCHS: int(trainer.max_epochs or -1),
            semconv.MAX_STEPS: int(trainer.max_steps),  # -1: none
            semconv.ACCUMULATE_GRAD_BATCHES: int(trainer.accumulate_grad_batches),
        }
    )
    if module is not None:
        run.watching(watch_for_run(module))


@guarded(_SITE)
def _epoch_end(run: LightningRun) -> None:
    run.epoch_ends()
    training.epoch_boundary(LIGHTNING)  # the model is final for the epoch: snapshots now


@guarded(_SITE)
def _batch_start(run: LightningRun, trainer: Any) -> None:
    step = training.step_of(LIGHTNING)
    if step is None or step.complete:  # else: a batch accumulating into the open step
        run.step_began_at = int(trainer.global_step)
        run.begin_step(run.step_began_at)


@guarded(_SITE)
def _batch_end(run: LightningRun, trainer: Any) -> None:
    if int(trainer.global_step) > run.step_began_at:  # the optimizer stepped: its work is done
        run.complete_step()


@guarded(_SITE)
def _pass_start(run: LightningRun, trainer: Any, name: str) -> None:
    sanity = run.training and name == semconv.EVALUATE and bool(trainer.sanity_checking)
    run.begin_pass(name, {semconv.SANITY_CHECK: True} if sanity else {})


@guarded(_SITE)
def _logged(trainer: Any, metrics: Any) -> None:
    """What Lightning hands its loggers: an evaluation's values on its pass (and, for validation
    during fit, on the epoch too); the rest where :func:`cirron.training.logged` puts them."""
    run = _run_of(trainer)
    if run is None or not metrics:
        return
    if run.passes:
        validation = run.passes[-1].opened[0].name == semconv.VALIDATE
        run.mark_pass(metrics, on_epoch=validation and not trainer.sanity_checking)
        return
    run.logged(metrics)


def _make_callback_class(base: Any) -> Any:
    class CirronCallback(base):  # type: ignore[misc, valid-type]
        """cirron's callback: reports the Trainer's moments (see the module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self.run = LightningRun()

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                _fit_start(self.run, trainer, pl_module)

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                self.run.begin_epoch(int(trainer.current_epoch))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if ACTIVE:
                _batch_start(self.run, trainer)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if ACTIVE:
                _batch_end(self.run, trainer)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                _epoch_end(self.run)

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                _pass_start(self.run, trainer, semconv.EVALUATE)

        def on_test_start(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                _pass_start(self.run, trainer, semconv.TEST)

        def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                _pass_start(self.run, trainer, semconv.PREDICT)

        def on_validation_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if ACTIVE:
                self.run.count_batch()

        on_test_batch_end = on_validation_batch_end
        on_predict_batch_end = on_validation_batch_end

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if ACTIVE:
                self.run.end_pass()

        on_test_end = on_validation_end
        on_predict_end = on_validation_end

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if ACTIVE:
                self.run.end(exception)

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
    return trainer if ACTIVE else None


def _add_callback(trainer: Any, error: BaseException | None) -> None:
    if error is None:
        _run_of(trainer, add=True)


def _fit_begins(trainer: Any, args: Any, kwargs: Any) -> LightningRun | None:
    """``fit()``: a trainer built before the instrumentor gets its callback; ``train`` opens."""
    run = _run_of(trainer, add=True) if ACTIVE else None
    if run is not None:  # (its loop has the moments: the torch hooks open none meanwhile)
        run.begin()
    return run


def _fit_ends(run: LightningRun, error: BaseException | None) -> None:
    run.end(error)


def _entry(trainer: Any, args: Any, kwargs: Any) -> None:
    """``validate``/``test``/``predict``: a trainer built earlier gets its callback first."""
    if ACTIVE:
        _run_of(trainer, add=True)


def _checkpoint_begins(trainer: Any, args: Any, kwargs: Any) -> Any:
    filepath = args[0] if args else kwargs.get("filepath")
    if not ACTIVE or filepath is None:
        return None
    return open_span(semconv.CHECKPOINT, {semconv.PATH: os.path.abspath(os.fspath(filepath))})


def _logs(connector: Any, args: Any, kwargs: Any) -> None:
    """``_LoggerConnector.log_metrics``: what Lightning hands its loggers."""
    metrics = args[0] if args else kwargs.get("metrics")
    if ACTIVE:
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
        self.wrap(pl.Trainer, "fit", _fit_begins, _fit_ends)
        for name in ("validate", "test", "predict"):
            self.wrap(pl.Trainer, name, _entry)
        self.wrap(pl.Trainer, "save_checkpoint", _checkpoint_begins, close_span)
        # What Lightning hands its loggers: the one place that knows a value's level.
        self.wrap(connectors._LoggerConnector, "log_metrics", _logs)
        ACTIVE.on = True

    def remove(self) -> None:
        ACTIVE.on = False
