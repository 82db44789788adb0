"""trainloop instrumentation: a ``BaseHook`` that reports a ``BaseTrainer``'s moments.

Installed by ``ci.profile()`` once the script imports trainloop, or on its
own with plain OpenTelemetry (``TrainloopInstrumentor().instrument(...)``).
A user's ``BaseTrainer`` subclass needs no change: ``BaseTrainer.train`` is
wrapped (a ``train`` span around it), and cirron's hook is appended to the
hooks the trainer built, right before ``on_before_train`` runs, so it sees
every hook call after the user's hooks. What becomes a span:

- ``step``: one per training step (an optimizer step), from
  ``on_before_step`` to the next one, indexed from 0 by trainloop's own
  counter (``trainer.step - 1``, so a resumed run goes on from its
  checkpoint's step). Its micro-steps (``gradient_accumulation_steps``) are
  inside it with their torch spans (``data_load``, ``forward``,
  ``backward``), then ``optimizer_step``: the torch hooks yield the step.
- ``epoch``: trainloop counts steps, not passes over the data, so epochs are
  cirron's fallback epochs of ``epoch_steps`` steps (the setting, 1000 by
  default); the last one ends with ``train()``. Each ends with a snapshot of
  the trainer's model (``trainer.unwrapped_model``), found with no
  ``ci.watch``.
- ``checkpoint``: a ``CheckpointingHook`` save, with its ``path``; inside the
  step it follows (trainloop runs it in that step's ``on_after_step``).
- Records given to ``trainer.log_scalars`` (by the user or a hook) are point
  marks on the step they describe, nested keys joined with ``/``; so are the
  statistics a ``StatsHook`` (``ProgressHook``) hands its callback every
  ``interval`` steps (``loss``, ``grad_norm``, ``step_time``, ``data_time``,
  ``lr``, the averaged forward records), on the step that ends the interval.
- A step whose gradients were non-finite and was retried carries an event
  ``non_finite_grad_retry`` with ``retries`` (the count), and the attribute
  ``non_finite_grad_retries``.

A ``train()`` that raises ends its step, epoch and ``train`` span with the
error recorded; the error reaches the user unchanged. Every hook runs behind
the guard. ``uninstrument()`` restores every patched method; hooks already
added to trainers go quiet.
"""

from __future__ import annotations

import os
from typing import Any

from .. import training
from ..otel import semconv
from ..recording.guard import call_guarded, guarded
from ..recording.marks import marks_from
from ..recording.scopes import close_span, current_span, open_span
from ..snapshots.watch import watch_for_run
from ..training.callbacks import FrameworkRun, Switch
from . import FrameworkInstrumentor, flatten

_SITE = "trainloop hook"
TRAINLOOP = training.owner("trainloop")
ACTIVE = Switch()  # the instrumentor is on: hooks added to trainers earlier go quiet
_hook_class: list[Any] = [None]  # made on first use: it subclasses trainloop's BaseHook
_running: list[TrainloopRun] = []  # the train() calls running now, innermost last


# -- the hook's moments -----------------------------------------------------------------------
@guarded(_SITE)
def _before_train(trainer: Any) -> None:
    model = getattr(trainer, "model", None)
    if model is not None:
        name = watch_for_run(trainer.unwrap(model))
        run = next((r for r in reversed(_running) if r.trainer is trainer), None)
        if run is not None:
            run.watching(name)


@guarded(_SITE)
def _before_step(trainer: Any) -> None:
    training.begin_step(TRAINLOOP, index=int(trainer.step) - 1, fallback_epoch=True)


@guarded(_SITE)
def _after_step(trainer: Any) -> None:
    _note_retries(trainer)
    training.complete_step(TRAINLOOP)  # open for what is logged until the next step


def _note_retries(trainer: Any) -> None:
    """The open step was retried for non-finite gradients: it says how often (also when it
    then failed, out of retries)."""
    step = training.step_of(TRAINLOOP)
    retries = int((getattr(trainer, "step_info", None) or {}).get("non_finite_grad_retries", 0))
    if step is not None and retries:
        span = step.opened[0]
        span.add_event(semconv.NON_FINITE_GRAD_RETRY, {semconv.RETRIES: retries})
        span.set_attribute(semconv.NON_FINITE_GRAD_RETRIES, retries)


@guarded(_SITE)
def _log_scalars(trainer: Any, records: Any) -> None:
    step = training.step_of(TRAINLOOP)
    if step is not None and step.index == int(trainer.step) - 1:  # the step it describes
        marks_from(step.opened[0], flatten(records), "point")
    else:
        marks_from(current_span(), flatten(records), "point")


def _make_hook_class() -> Any:
    from trainloop import BaseHook

    class CirronHook(BaseHook):  # type: ignore[misc]
        """cirron's hook: reports the trainer's moments (see the module docstring)."""

        def on_before_train(self, trainer: Any) -> None:
            if ACTIVE:
                _before_train(trainer)

        def on_before_step(self, trainer: Any) -> None:
            if ACTIVE:
                _before_step(trainer)

        def on_after_step(self, trainer: Any) -> None:
            if ACTIVE:
                _after_step(trainer)

        def on_log_scalars(self, trainer: Any, records: Any, dry_run: bool = False) -> None:
            if ACTIVE and not dry_run and records:
                _log_scalars(trainer, records)

    return CirronHook


def hook_class() -> Any:
    if _hook_class[0] is None:
        _hook_class[0] = _make_hook_class()
    return _hook_class[0]


@guarded(_SITE)
def _stats(trainer: Any, stats: Any) -> None:
    """What a ``StatsHook`` (``ProgressHook``) hands its callback: marks on the step."""
    values: dict[str, Any] = {
        "loss": stats.loss,
        "grad_norm": stats.grad_norm,
        "step_time": stats.step_time,
        "data_time": stats.data_time,
        "non_finite_grad_retries": stats.non_finite_grad_retries,
        "cuda_max_memory": stats.cuda_max_memory,
    }
    groups = list(stats.param_groups or [])
    for position, group in enumerate(groups):
        if "lr" in group:
            label = group.get("name") or str(position)
            values["lr" if len(groups) == 1 else f"lr/{label}"] = group["lr"]
    values.update(flatten(stats.records or {}))
    _log_scalars(trainer, {k: v for k, v in values.items() if v is not None})


def _forwarding(callback: Any) -> Any:
    """A ``StatsHook`` callback that also gives cirron what it is handed."""

    def forward(trainer: Any, stats: Any) -> Any:
        if ACTIVE:
            _stats(trainer, stats)
        return callback(trainer, stats)

    forward.__wrapped__ = callback  # type: ignore[attr-defined]
    forward.cirron = True  # type: ignore[attr-defined]
    return forward


@guarded(_SITE)
def _add_hook(trainer: Any) -> None:
    from trainloop import StatsHook

    hooks = getattr(trainer, "hooks", None)
    if not isinstance(hooks, list):
        return
    for hook in hooks:
        callback = getattr(hook, "callback", None)
        if isinstance(hook, StatsHook) and callable(callback) and not hasattr(callback, "cirron"):
            hook.callback = _forwarding(callback)
    cls = hook_class()
    if not any(isinstance(h, cls) for h in hooks):
        hooks.append(cls())


# -- train(), and checkpoint saves: spans around trainloop methods ------------------------------
class TrainloopRun(FrameworkRun):
    """One ``train()``, and its trainer."""

    def __init__(self, trainer: Any) -> None:
        super().__init__(TRAINLOOP, _SITE)
        self.trainer = trainer


def _train_begins(trainer: Any, args: Any, kwargs: Any) -> TrainloopRun | None:
    if not ACTIVE:
        return None
    run = TrainloopRun(trainer)
    run.begin(  # its loop has the moments: the torch hooks open none meanwhile
        {
            semconv.MAX_STEPS: int(trainer.max_steps),
            semconv.GRADIENT_ACCUMULATION_STEPS: int(trainer.gradient_accumulation_steps),
        }
    )
    _running.append(run)
    return run


def _train_ends(run: TrainloopRun, error: BaseException | None) -> None:
    if run in _running:
        _running.remove(run)
    if error is not None:  # a step out of retries raised before its on_after_step
        call_guarded(_SITE, _note_retries, run.trainer)
    run.end(error)  # its epoch (with the step inside), a step inside a higher owner's epoch


def _before_train_begins(trainer: Any, args: Any, kwargs: Any) -> None:
    if ACTIVE:
        _add_hook(trainer)  # the hooks are built by now; ours runs after the user's


def _checkpoint_begins(hook: Any, args: Any, kwargs: Any) -> Any:
    trainer = args[0] if args else kwargs.get("trainer")
    if not ACTIVE or trainer is None:
        return None
    path = hook.path / str(trainer.step)
    if not path.is_absolute() and trainer.workspace is not None:
        path = trainer.workspace / path
    return open_span(semconv.CHECKPOINT, {semconv.PATH: os.path.abspath(path)})


class TrainloopInstrumentor(FrameworkInstrumentor):
    """OpenTelemetry instrumentor for trainloop's ``BaseTrainer`` (see the module docstring)."""

    framework = "trainloop"
    site = _SITE

    def install(self, module: str) -> None:
        from trainloop import BaseTrainer, CheckpointingHook

        self.wrap(BaseTrainer, "train", _train_begins, _train_ends)
        self.wrap(BaseTrainer, "_before_train", _before_train_begins)
        if "_save_checkpoint" in CheckpointingHook.__dict__:
            self.wrap(CheckpointingHook, "_save_checkpoint", _checkpoint_begins, close_span)
        ACTIVE.on = True

    def remove(self) -> None:
        ACTIVE.on = False
