"""The torch hooks around an optimizer's work: ``optimizer.step()`` (global pre and post
hooks, and a catcher of the exceptions torch calls no hook for) and
``GradScaler.step()``, the optimizer moment of a mixed-precision step.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

from .. import hook_spans, training
from ..guard import guarded
from ..hook_spans import HookSpan
from .torch_spans import SITE, open_hook
from .torch_steps import LOOP, TORCH

optimizer_spans: dict[int, HookSpan] = {}  # the open optimizer_step span of each optimizer


# -- optimizer ---------------------------------------------------------------------
@guarded(SITE)
def before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    stale = optimizer_spans.pop(id(optimizer), None)
    if stale is not None:  # the previous step() raised before its post hook (not caught)
        hook_spans.end(stale, RuntimeError("optimizer.step() raised"))
    if type(optimizer) not in failure_catchers:  # an optimizer built before the hooks attached
        _catch_failures(type(optimizer))
    LOOP.optimizer_stepping()
    entered = open_hook("optimizer_step", {"optimizer": type(optimizer).__name__})
    if entered is not None:
        optimizer_spans[id(optimizer)] = entered


@guarded(SITE)
def after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    entered = optimizer_spans.pop(id(optimizer), None)
    if entered is not None:
        hook_spans.end(entered)
    # Where the user called step(): above torch's wrapper (frame 2, under the guard's), and
    # above our failure catcher around it when there is one.
    frame = sys._getframe(2)
    caller = frame.f_back
    if caller is not None and caller.f_code is _CATCHING_CODE:
        frame = caller
    LOOP.optimizer_stepped(frame)


@guarded(SITE)
def _optimizer_built(optimizer: Any) -> None:
    LOOP.optimizer_built()
    _catch_failures(type(optimizer))


def make_optimizer_init(original: Any) -> Any:
    """Our ``Optimizer.__init__``: a loop with an optimizer ends its steps at optimizer steps."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _optimizer_built(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


# Optimizer classes whose step() we wrapped, with the step() torch had given them.
failure_catchers: dict[type, Any] = {}


def _catching(step: Any) -> Any:
    """``step`` (torch's hooked wrapper of an optimizer's step) inside one that ends the
    ``optimizer_step`` span of a call that raises, with the error: torch calls no post hook
    then."""
    failed = guarded(SITE)(_optimizer_failed)

    def catching(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return step(self, *args, **kwargs)
        except BaseException as error:
            failed(self, error)
            raise

    functools.update_wrapper(catching, step)  # keeps torch's `hooked` mark: no second wrap
    catching._cirron_catches = True  # type: ignore[attr-defined]
    return catching


def _catch_failures(cls: type) -> None:
    step = cls.__dict__.get("step")
    failure_catchers.setdefault(cls, None)
    if step is None or getattr(step, "_cirron_catches", False):
        return
    failure_catchers[cls] = step
    cls.step = _catching(step)  # type: ignore[attr-defined]


def _optimizer_failed(optimizer: Any, error: BaseException) -> None:
    entered = optimizer_spans.pop(id(optimizer), None)
    if entered is not None:
        hook_spans.end(entered, error)


_CATCHING_CODE = _catching(lambda self: None).__code__  # every catcher runs this code


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
    attributes: dict[str, Any] = {"skipped": True}
    if scale is not None:
        # Read once per skipped step only, after GradScaler read found_inf itself
        # (so the device has nothing of ours to wait for).
        attributes["loss_scale"] = float(scale.item() if hasattr(scale, "item") else scale)
    LOOP.skipped_step(attributes, sys._getframe(1))
    step = training.step_of(TORCH)
    hook_spans.record_on(
        step.opened[0] if step is not None else None,
        "optimizer_step",
        {"optimizer": type(optimizer).__name__, "skipped": True},
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
    """The hooks come off: every optimizer class gets its own step() back."""
    for cls, step in reversed(failure_catchers.items()):
        if step is not None:
            cls.step = step  # type: ignore[attr-defined]
    failure_catchers.clear()
    optimizer_spans.clear()
