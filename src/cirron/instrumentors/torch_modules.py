"""The torch hooks around a model's work: its outermost calls (``forward``), ``train()``/
``eval()``, and ``backward``. What each call means for the loop is decided by
:class:`.torch_steps.TorchLoop`; these only tell it and note the span.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import Any

from ..otel import semconv
from ..recording import hook_spans, hot
from ..recording.guard import call_guarded, guarded, report
from ..recording.hook_spans import HookSpan
from . import torch_collectives, torch_comm_hooks
from .torch_spans import SITE, close_guarded, open_hook, torch_module
from .torch_steps import LOOP

_inside_forward = False  # an outermost module call is running (any thread)
_loss_class: list[Any] = [None]  # torch.nn.modules.loss._Loss once attached
_inside_train = [False]
# A backward runs, and on which thread: a forward there is activation checkpointing's
# recomputation. [depth, thread id]
backward_running: list[Any] = [0, None]
# Outermost modules seen so far: id -> (weak reference, class name of the user's model
# inside any wrapper, the wrapper's class name or None). Tells a pass that begins while
# a model trains from one that begins in evaluation; a dict, so the hot path only looks
# an int up.
seen_models: dict[int, tuple[weakref.ref[Any], str, str | None]] = {}
grad_enabled: list[Any] = [None]  # torch.is_grad_enabled once attached
parameter_class: list[Any] = [None]  # torch.nn.Parameter once attached
# The attributes of the forward about to run whose span waits for its batch to be judged
# (:meth:`.torch_steps.TorchLoop.hold`); None for any other.
_held: list[dict[str, Any] | None] = [None]
_thread_id = threading.get_ident


# -- forward -----------------------------------------------------------------------
# Module wrappers, by class name: the attribute that holds the user's model.
_WRAPPERS = {
    "OptimizedModule": "_orig_mod",  # torch.compile
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "_fsdp_wrapped_module",  # FSDP (1)
    "_FabricModule": "_original_module",  # Lightning Fabric
    "DeepSpeedEngine": "module",
}


def unwrap(model: Any) -> Any:
    """The user's model inside DDP / DataParallel / torch.compile / FSDP / Fabric wrappers."""
    while True:
        attribute = _WRAPPERS.get(type(model).__name__)
        inner = getattr(model, attribute, None) if attribute is not None else None
        if inner is None:
            return model
        model = inner


def _model_class(module: Any) -> str:
    """The class the user wrote: FSDP2's ``fully_shard`` makes ``FSDP<Name>`` of it."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__mro__) > 2:
        for base in cls.__mro__[1:]:
            if base.__name__ != "FSDPModule" and base.__name__ == cls.__name__[4:]:
                return base.__name__
    return cls.__name__


def _remember(module: Any) -> tuple[weakref.ref[Any], str, str | None]:
    key = id(module)
    inner = unwrap(module)
    entry = seen_models[key] = (
        weakref.ref(module, lambda _ref: seen_models.pop(key, None)),
        _model_class(inner),
        type(module).__name__ if inner is not module else None,
    )
    if inner is not module:  # a wrapper: DDP's all-reduce gets its spans
        call_guarded(SITE, torch_comm_hooks.watch_wrapped, module)
    return entry


def any_seen_model_training() -> bool:
    models = [entry[0]() for entry in list(seen_models.values())]
    return any(model.training for model in models if model is not None)


def _on_meta_device(args: Any, kwargs: Any) -> bool:
    """A call on tensors of the ``meta`` device: shape inference (Keras on the torch backend
    builds a model so), not work on data."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    return getattr(first, "is_meta", False) is True


def _open_forward(module: Any, args: Any, kwargs: Any) -> HookSpan | None:
    """The ``forward`` span of an outermost call, after telling the loop what work it is
    (behind the core guard, inline in :func:`_outermost_call`); None for no span, with the
    attributes in :data:`_held` for a span held until its batch is judged."""
    entry = seen_models.get(id(module)) or _remember(module)
    attributes: dict[str, Any] = {semconv.MODE: semconv.MODE_TRAIN, semconv.MODULE: entry[1]}
    if entry[2] is not None:
        attributes[semconv.WRAPPER] = entry[2]
    if backward_running[0]:  # inside a backward: activation checkpointing recomputes a block
        if backward_running[1] != _thread_id():
            return None  # on autograd's own thread: nothing of ours to nest it in
        attributes[semconv.RECOMPUTE] = True
        return open_hook(semconv.FORWARD, attributes)
    if module.training and grad_enabled[0]():
        LOOP.training_work()
    else:
        if _on_meta_device(args, kwargs):
            return None  # building the model: no forward
        attributes[semconv.MODE] = semconv.MODE_EVAL
        if LOOP.evaluation_work(sys._getframe(1)):
            _held[0] = attributes
            return None
    return open_hook(semconv.FORWARD, attributes)


def _held_call(original: Any, self: Any, args: Any, kwargs: Any, attributes: dict) -> Any:
    """A forward whose span waits for its batch to be judged (the loop places it)."""
    start = time.time_ns()
    try:
        result = original(self, *args, **kwargs)
    except BaseException as error:
        call_guarded(SITE, LOOP.hold, attributes, start, error)
        raise
    call_guarded(SITE, LOOP.hold, attributes, start, None)
    return result


def _control_flow(error: BaseException) -> bool:
    """An exception torch raises to stop a recomputation early: not a failure."""
    return type(error).__name__ == "_StopRecomputationError"


def forward_failed(entered: HookSpan, error: BaseException) -> None:
    """The call inside ``entered``, a ``forward`` span, raised ``error``: the span ends with it
    (the compiled ``__call__``'s way out, as :func:`_forward_call`'s)."""
    close_guarded(entered, None if _control_flow(error) else error)


def _forward_call(original: Any, self: Any, args: Any, kwargs: Any) -> Any:
    """An outermost module call, with the "inside a forward" flag set: a ``forward`` span
    around ``original``. The compiled ``__call__`` (:mod:`cirron.recording.hot`) calls it too."""
    # A loss module (and any module inside it, e.g. a perceptual loss's
    # network) is not a forward of the model.
    if isinstance(self, _loss_class[0]):
        return original(self, *args, **kwargs)
    try:  # the core guard, inline (as for each guarded call below): once a forward
        entered = _open_forward(self, args, kwargs)
    except Exception as failure:  # noqa: BLE001
        report(SITE, failure)
        entered = None
    if entered is None:
        held = _held[0]
        if held is not None:
            _held[0] = None
            return _held_call(original, self, args, kwargs, held)
        return original(self, *args, **kwargs)
    try:
        result = original(self, *args, **kwargs)
    except BaseException as error:
        close_guarded(entered, None if _control_flow(error) else error)
        raise
    try:
        hook_spans.end(entered)
    except Exception as failure:  # noqa: BLE001
        report(SITE, failure)
    return result


def _outermost_call(original: Any, self: Any, args: Any, kwargs: Any) -> Any:
    """An outermost module call of the pure-Python ``__call__``: the flag, then the call."""
    global _inside_forward
    _inside_forward = True
    try:
        return _forward_call(original, self, args, kwargs)
    finally:
        _inside_forward = False


def make_module_call(original: Any) -> Any:
    """Our ``nn.Module.__call__``: a span for the outermost call only; the compiled twin
    (:mod:`cirron.recording.hot`) where it is built, else the pure-Python one below.

    Submodules take the first branch, one read of a module-level flag, and
    then do what torch's own ``__call__`` (``_wrapped_call_impl``) does in
    the same single Python frame, so a model of 400 modules pays ~400 flag
    reads per forward and nothing else (the flag is a plain global: a read
    through a closure cell or a list costs several times more, per call of
    every submodule). The flag is process-wide, not per thread: a module
    another thread calls while a forward runs is not a span of its own. A
    loss module called on its own is not a span either (docs/guide/pytorch.md):
    its few microseconds show as the gap between ``forward`` and
    ``backward`` inside the step.
    """
    _loss_class[0] = torch_module().nn.modules.loss._Loss
    torch_call = getattr(original, "__name__", "") == "_wrapped_call_impl"
    if hot.compiled is not None:  # the same, with no Python frame for a submodule's call
        return hot.compiled.ModuleCall(original, _forward_call, torch_call, _loss_class[0])
    outermost = _outermost_call

    if not torch_call:  # someone else's __call__

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _inside_forward:
                return original(self, *args, **kwargs)
            return outermost(original, self, args, kwargs)

    else:

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            if _inside_forward:
                if self._compiled_call_impl is not None:
                    return self._compiled_call_impl(*args, **kwargs)
                return self._call_impl(*args, **kwargs)
            return outermost(original, self, args, kwargs)

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


def make_train(original: Any) -> Any:
    """Our ``nn.Module.train``: ``model.eval()`` before the first forward tells us the mode."""
    remember = guarded(SITE)(_remember)

    def train(self: Any, mode: bool = True) -> Any:
        if _inside_train[0]:
            return original(self, mode)
        _inside_train[0] = True
        try:
            if id(self) not in seen_models:
                remember(self)
            return original(self, mode)
        finally:
            _inside_train[0] = False

    train.__wrapped__ = original  # type: ignore[attr-defined]
    return train


# -- backward ----------------------------------------------------------------------
def _open_backward() -> HookSpan | None:
    LOOP.training_work()
    hook = open_hook(semconv.BACKWARD, {})
    if hook is not None and torch_comm_hooks.buckets_recorded[0]:
        torch_collectives.backward_begins(hook)  # DDP's buckets are its children
    return hook


def _close_backward(entered: HookSpan | None, error: BaseException | None = None) -> None:
    if entered is not None:
        if torch_comm_hooks.buckets_recorded[0]:  # (as at its begin: DDP's buckets inside)
            torch_collectives.backward_ends(entered)
        hook_spans.end(entered, error)
    if error is None:
        LOOP.backward_done()


close_backward = guarded(SITE)(_close_backward)  # a backward that raised


def make_backward(original: Any) -> Any:
    """Our ``torch.autograd.backward``; ``Tensor.backward`` calls it, so one patch covers both.
    The compiled twin where it is built (:mod:`cirron.recording.hot`), with this one for all
    but a backward inside a step that an optimizer step ends."""

    def backward(*args: Any, **kwargs: Any) -> Any:
        try:  # the core guard, inline: once a backward
            entered = _open_backward()
        except Exception as failure:  # noqa: BLE001
            report(SITE, failure)
            entered = None
        running = backward_running
        running[0] += 1
        running[1] = _thread_id()
        try:
            result = original(*args, **kwargs)
        except BaseException as error:
            running[0] -= 1
            close_backward(entered, error)
            raise
        running[0] -= 1
        try:
            _close_backward(entered)
        except Exception as failure:  # noqa: BLE001
            report(SITE, failure)
        return result

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    backward.__name__ = "backward"
    if hot.compiled is not None:  # a backward inside the open step, with no Python frame
        return hot.compiled.LoopHook(hot.BACKWARD, original, backward)
    return backward


def _updates_parameters(inputs: Any) -> bool:
    """Gradients with respect to parameters: the backward of a training step (an attack's
    gradient with respect to its input, or a gradient penalty's, is not)."""
    parameter = parameter_class[0]
    if isinstance(inputs, parameter):
        return True
    return isinstance(inputs, list | tuple) and any(isinstance(x, parameter) for x in inputs)


def make_grad(original: Any) -> Any:
    """Our ``torch.autograd.grad``: with respect to parameters, it is the step's backward
    (updates made by hand, without ``backward()`` or an optimizer)."""
    updates_parameters = guarded(SITE)(_updates_parameters)
    open_backward = guarded(SITE)(_open_backward)

    def grad(outputs: Any, inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
        if inputs is None or not updates_parameters(inputs):
            if inputs is None:
                return original(outputs, *args, **kwargs)
            return original(outputs, inputs, *args, **kwargs)
        entered = open_backward()
        running = backward_running
        running[0] += 1
        running[1] = _thread_id()
        try:
            result = original(outputs, inputs, *args, **kwargs)
        except BaseException as error:
            running[0] -= 1
            close_backward(entered, error)
            raise
        running[0] -= 1
        close_backward(entered)
        return result

    grad.__wrapped__ = original  # type: ignore[attr-defined]
    grad.__name__ = "grad"
    return grad


def forget() -> None:
    """The hooks come off: nothing of the models seen is kept."""
    seen_models.clear()
    backward_running[0], backward_running[1] = 0, None
    grad_enabled[0] = parameter_class[0] = _held[0] = None
