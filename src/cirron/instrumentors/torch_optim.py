"""The torch hooks around an optimizer's work: ``optimizer.step()`` (global pre and post
hooks; a closure passed to it is watched for the exception after which torch calls no post
hook) and ``GradScaler.step()``, the optimizer moment of a mixed-precision step.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

from .. import training
from ..otel import semconv
from ..recording import hook_spans, hot
from ..recording.guard import guarded, report
from ..recording.hook_spans import HookSpan
from .torch_spans import SITE, open_hook
from .torch_steps import LOOP, TORCH

optimizer_spans: dict[int, HookSpan] = {}  # the open optimizer_step span of each optimizer


# -- optimizer ---------------------------------------------------------------------
def before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> Any:
    """torch's pre hook: the ``optimizer_step`` span begins. A closure (LBFGS) comes back
    wrapped, so that the span of a step whose closure raises ends then, with the error."""
    try:  # the core guard, inline: once an optimizer step
        stale = optimizer_spans.pop(id(optimizer), None)
        if stale is not None:  # the previous step() raised outside a closure, and was caught
            hook_spans.end(stale, RuntimeError("optimizer.step() raised"))
        LOOP.optimizer_stepping()
        entered = open_hook(semconv.OPTIMIZER_STEP, {semconv.OPTIMIZER: type(optimizer).__name__})
        if entered is None:
            return None
        optimizer_spans[id(optimizer)] = entered
        if len(args) == 1 and not kwargs:  # optimizer.step(): no closure
            return None
        if len(args) > 1 and callable(args[1]):
            return (args[0], _watched(args[1], optimizer), *args[2:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": _watched(kwargs["closure"], optimizer)}
    except Exception as error:  # noqa: BLE001
        report(SITE, error)
    return None


def _watched(closure: Any, optimizer: Any) -> Any:
    """``closure``, telling the optimizer's span when it raises (torch runs no post hook)."""
    failed = guarded(SITE)(_optimizer_failed)

    def closure_of_the_step(*args: Any, **kwargs: Any) -> Any:
        try:
            return closure(*args, **kwargs)
        except BaseException as error:
            failed(optimizer, error)
            raise

    return functools.update_wrapper(closure_of_the_step, closure)


def _optimizer_failed(optimizer: Any, error: BaseException) -> None:
    entered = optimizer_spans.pop(id(optimizer), None)
    if entered is not None:
        hook_spans.end(entered, error)


def after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """torch's post hook: the ``optimizer_step`` span ends, and the step's work is done."""
    try:  # the core guard, inline: once an optimizer step
        entered = optimizer_spans.pop(id(optimizer), None)
        if entered is not None:
            hook_spans.end(entered)
        LOOP.optimizer_stepped(sys._getframe(1))  # torch's wrapper: the user's step() above it
    except Exception as error:  # noqa: BLE001
        report(SITE, error)


def step_hooks() -> tuple[Any, Any]:
    """The optimizer step's global (pre, post) hooks to register: the compiled twins of
    :func:`before_optimizer_step` and :func:`after_optimizer_step` where they are built
    (:mod:`cirron.recording.hot`), which run those for all but ``optimizer.step()`` with no
    closure inside the open step."""
    if hot.compiled is None:
        return before_optimizer_step, after_optimizer_step
    return (
        hot.compiled.LoopHook(hot.OPTIMIZER_PRE, None, before_optimizer_step),
        hot.compiled.LoopHook(hot.OPTIMIZER_POST, None, after_optimizer_step),
    )


@guarded(SITE)
def _optimizer_built() -> None:
    LOOP.optimizer_built()


def make_optimizer_init(original: Any) -> Any:
    """Our ``Optimizer.__init__``: a loop with an optimizer ends its steps at optimizer steps."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _optimizer_built()

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


# -- GradScaler ----------------------------------------------------------------------
@guarded(SITE)
def _scaler_begins() -> tuple[int, int]:
    return LOOP.optimizer_steps, time.time_ns()


@guarded(SITE)
def _scaler_ends(token: tuple[int, int], scaler: Any, optimizer: Any) -> None:
    """``GradScaler.step`` returned: if it skipped ``optimizer.step()``, that is still the
    step's optimizer moment, and the step says it was skipped, with the loss scale."""
    steps_before, started = token
    if LOOP.optimizer_steps != steps_before:
        return  # it stepped: the optimizer hooks saw it
    scale = getattr(scaler, "_scale", None)
    attributes: dict[str, Any] = {semconv.SKIPPED: True}
    if scale is not None:
        # Read once per skipped step only, after GradScaler read found_inf itself
        # (so the device has nothing of ours to wait for).
        attributes[semconv.LOSS_SCALE] = float(scale.item() if hasattr(scale, "item") else scale)
    LOOP.skipped_step(attributes, sys._getframe(1))
    step = training.step_of(TORCH)
    hook_spans.record_on(
        step.opened[0] if step is not None else None,
        semconv.OPTIMIZER_STEP,
        {semconv.OPTIMIZER: type(optimizer).__name__, semconv.SKIPPED: True},
        started,
        time.time_ns(),
    )


def make_scaler_step(original: Any) -> Any:
    """Our ``torch.amp.GradScaler.step`` (``torch.cuda.amp``'s too: a subclass)."""

    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        token = _scaler_begins()
        result = original(self, optimizer, *args, **kwargs)
        if token is not None:
            _scaler_ends(token, self, optimizer)
        return result

    step.__wrapped__ = original  # type: ignore[attr-defined]
    return functools.update_wrapper(step, original)


def forget() -> None:
    """The hooks come off: no optimizer step is open any more."""
    optimizer_spans.clear()
