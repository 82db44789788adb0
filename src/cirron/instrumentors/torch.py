"""PyTorch instrumentation: training steps, epochs, forward, backward, optimizer and data spans.

Installed by ``ci.profile()`` once the script imports torch, or on its own
with plain OpenTelemetry::

    from cirron.instrumentors.torch import TorchInstrumentor
    TorchInstrumentor().instrument(tracer_provider=provider)

What becomes a span:

- ``forward``: one per call of an *outermost* module (attribute ``mode`` =
  ``train`` in train mode with gradients, else ``eval``; ``module`` = the
  class of the user's model, inside any DDP / ``torch.compile`` / FSDP /
  Fabric wrapper, whose class is ``wrapper``). Calls of its submodules are not
  spans and cost next to nothing. A block that activation checkpointing
  recomputes during ``backward`` is a ``forward`` with ``recompute`` true
  inside that backward, never a training forward of its own. A loss module called on its own
  (``nn.CrossEntropyLoss()(out, y)``) is not a span: its time is the gap
  between ``forward`` and ``backward`` in the step.
- ``backward``: ``loss.backward()`` and ``torch.autograd.backward(...)`` (one
  patch of the latter: ``Tensor.backward`` calls it).
- ``optimizer_step``: every ``optimizer.step()`` (global optimizer hooks); one
  that raises ends with the error. A ``GradScaler.step()`` that skipped the
  optimizer (inf/NaN gradients) is an ``optimizer_step`` with ``skipped``
  true, and its step says ``skipped`` and ``loss_scale``.
- ``data_load``: the wait inside a DataLoader iterator's ``__next__``, a
  child of the step its batch feeds (status ERROR when the fetch raised).
- ``step``, ``epoch``, ``validate``/``evaluate``: found from these moments by
  :mod:`.torch_steps` and reported to :mod:`cirron.training`, which opens them
  unless a higher owner (``ci.epochs``/``ci.batches``, HF Trainer, Keras) has
  them.

Every hook runs through the core guard: a failure inside cirron is counted in
``ci.health()``, warned about once, and the training step runs on unchanged.
``uninstrument()`` restores every patched attribute and removes every hook.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from typing import Any

from .. import hook_spans, loops, recorder, training, training_state, values
from ..guard import guarded
from ..hook_spans import HookSpan
from . import FrameworkInstrumentor
from .torch_steps import EXHAUSTED, TORCH, LoaderPass, TorchLoop

_SITE = "torch hook"


_inside_forward = False  # an outermost module call is running (any thread)
_loss_class: list[Any] = [None]  # torch.nn.modules.loss._Loss once attached
_inside_train = [False]
# A backward runs, and on which thread: a forward there is activation checkpointing's
# recomputation. [depth, thread id]
_backward: list[Any] = [0, None]
# Outermost modules seen so far: id -> (weak reference, class name of the user's model
# inside any wrapper, the wrapper's class name or None). Tells a pass that begins while
# a model trains from one that begins in evaluation; a dict, so the hot path only looks
# an int up.
_seen_models: dict[int, tuple[weakref.ref[Any], str, str | None]] = {}
_optimizer_spans: dict[int, HookSpan] = {}
_PASS = "_cirron_pass"  # the iterator's attribute: its LoaderPass (one per pass over a loader)
_cuda: list[Any] = [None]  # torch.cuda once attached: its _initialized flag says CUDA is in use
_grad_enabled: list[Any] = [None]  # torch.is_grad_enabled once attached
_loop = TorchLoop()  # what the hooks have seen of the loop (new at every attach)


_thread_id = threading.get_ident


def _torch() -> Any:
    return sys.modules["torch"]


# -- spans around a call, with GPU time --------------------------------------------
# Hook code runs behind the core guard (cirron.guard.guarded) at each hook's entry
# points; the helpers they call are plain functions. The user's call a hook wraps
# (the forward, the backward) runs outside the guard, so its exceptions reach the
# user unchanged.
def _open(name: str, attributes: dict[str, Any]) -> HookSpan | None:
    """Note the start of a hook span (built when it ends: :mod:`cirron.hook_spans`).

    When CUDA is in use the span gets ``gpu_ns`` from a CUDA event pair,
    recorded on the current stream and read by the flush thread later
    (``Event.query()`` never waits), so the training stream is never
    synchronised. On a CPU-only run there is no attribute at all.
    """
    hook = hook_spans.begin(name, attributes)
    cuda = _cuda[0]
    if hook is not None and cuda is not None and cuda._initialized and cuda.is_initialized():
        hook.device_timer = _gpu_timer()
    return hook


_close_guarded = guarded(_SITE)(hook_spans.end)


def _recorded_event() -> Any:
    event = _cuda[0].Event(enable_timing=True)
    event.record()
    return event


def _gpu_timer() -> Any:
    """Record a start event now; the returned function records the end event when called."""
    start = _recorded_event()

    def stop() -> tuple[str, Any]:
        end = _recorded_event()
        return "gpu_ns", lambda final: _elapsed_ns(start, end, final)

    return stop


def _device_value(tensor: Any) -> Any:
    """How a mark reads a one-element CUDA tensor without waiting for the device.

    The value is copied to (pinned) host memory behind the work already queued
    on the current stream, and an event recorded after the copy; the flush
    thread reads it once the event has passed (``ci.trace()``, a flush or
    shutdown wait for it). None for other devices: read at the mark.
    """
    cuda = _cuda[0]
    if cuda is None or tensor.device.type != "cuda":
        return None
    copy = tensor.detach().reshape(()).to("cpu", non_blocking=True)
    event = cuda.Event()
    event.record()

    def resolve(final: bool) -> Any:
        if not event.query():
            if not final:
                return None
            event.synchronize()
        return copy.item()

    return resolve


def _elapsed_ns(start: Any, end: Any, final: bool) -> int | None:
    """GPU time between two recorded events; None while the GPU hasn't got there."""
    if not end.query():
        if not final:
            return None
        end.synchronize()  # flush or shutdown: worth waiting for, once
    return int(start.elapsed_time(end) * 1e6)


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
    entry = _seen_models[key] = (
        weakref.ref(module, lambda _ref: _seen_models.pop(key, None)),
        _model_class(inner),
        type(module).__name__ if inner is not module else None,
    )
    return entry


def _any_seen_model_training() -> bool:
    models = [entry[0]() for entry in list(_seen_models.values())]
    return any(model.training for model in models if model is not None)


@guarded(_SITE)
def _open_forward(module: Any) -> HookSpan | None:
    """The ``forward`` span of an outermost call, after telling the loop what work it is."""
    entry = _seen_models.get(id(module)) or _remember(module)
    attributes: dict[str, Any] = {"mode": "train", "module": entry[1]}
    if entry[2] is not None:
        attributes["wrapper"] = entry[2]
    if _backward[0]:  # inside a backward: activation checkpointing recomputes a block
        if _backward[1] != _thread_id():
            return None  # on autograd's own thread: nothing of ours to nest it in
        attributes["recompute"] = True
        return _open("forward", attributes)
    if module.training and _grad_enabled[0]():
        _loop.training_work()
    else:
        attributes["mode"] = "eval"
        _loop.evaluation_work(sys._getframe(1))
    return _open("forward", attributes)


def _control_flow(error: BaseException) -> bool:
    """An exception torch raises to stop a recomputation early: not a failure."""
    return type(error).__name__ == "_StopRecomputationError"


def _outermost_call(original: Any, self: Any, args: Any, kwargs: Any) -> Any:
    """An outermost module call: a ``forward`` span around ``original``."""
    global _inside_forward
    _inside_forward = True
    try:
        # A loss module (and any module inside it, e.g. a perceptual loss's
        # network) is not a forward of the model.
        entered = None if isinstance(self, _loss_class[0]) else _open_forward(self)
        if entered is None:
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            _close_guarded(entered, None if _control_flow(error) else error)
            raise
        _close_guarded(entered)
        return result
    finally:
        _inside_forward = False


def _make_module_call(original: Any) -> Any:
    """Our ``nn.Module.__call__``: a span for the outermost call only.

    Submodules take the first branch, one read of a module-level flag, and
    then do what torch's own ``__call__`` (``_wrapped_call_impl``) does in
    the same single Python frame, so a model of 400 modules pays ~400 flag
    reads per forward and nothing else (the flag is a plain global: a read
    through a closure cell or a list costs several times more, per call of
    every submodule). The flag is process-wide, not per thread: a module
    another thread calls while a forward runs is not a span of its own. A
    loss module called on its own is not a span either (see the README):
    its few microseconds show as the gap between ``forward`` and
    ``backward`` inside the step.
    """
    _loss_class[0] = _torch().nn.modules.loss._Loss
    outermost = _outermost_call

    if getattr(original, "__name__", "") != "_wrapped_call_impl":  # someone else's __call__

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


def _make_train(original: Any) -> Any:
    """Our ``nn.Module.train``: ``model.eval()`` before the first forward tells us the mode."""
    remember = guarded(_SITE)(_remember)

    def train(self: Any, mode: bool = True) -> Any:
        if _inside_train[0]:
            return original(self, mode)
        _inside_train[0] = True
        try:
            if id(self) not in _seen_models:
                remember(self)
            return original(self, mode)
        finally:
            _inside_train[0] = False

    train.__wrapped__ = original  # type: ignore[attr-defined]
    return train


# -- backward ----------------------------------------------------------------------
@guarded(_SITE)
def _open_backward() -> HookSpan | None:
    _loop.training_work()
    return _open("backward", {})


@guarded(_SITE)
def _close_backward(entered: HookSpan | None, error: BaseException | None = None) -> None:
    if entered is not None:
        hook_spans.end(entered, error)
    if error is None:
        _loop.backward_done()


def _make_backward(original: Any) -> Any:
    """Our ``torch.autograd.backward``; ``Tensor.backward`` calls it, so one patch covers both."""

    def backward(*args: Any, **kwargs: Any) -> Any:
        entered = _open_backward()
        running = _backward
        running[0] += 1
        running[1] = _thread_id()
        try:
            result = original(*args, **kwargs)
        except BaseException as error:
            running[0] -= 1
            _close_backward(entered, error)
            raise
        running[0] -= 1
        _close_backward(entered)
        return result

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    backward.__name__ = "backward"
    return backward


# -- optimizer ---------------------------------------------------------------------
@guarded(_SITE)
def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    stale = _optimizer_spans.pop(id(optimizer), None)
    if stale is not None:  # the previous step() raised before its post hook (not caught)
        hook_spans.end(stale, RuntimeError("optimizer.step() raised"))
    _catch_failures(type(optimizer))  # an optimizer built before the hooks attached
    _loop.optimizer_stepping()
    entered = _open("optimizer_step", {"optimizer": type(optimizer).__name__})
    if entered is not None:
        _optimizer_spans[id(optimizer)] = entered


@guarded(_SITE)
def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    entered = _optimizer_spans.pop(id(optimizer), None)
    if entered is not None:
        hook_spans.end(entered)
    _loop.optimizer_stepped()


@guarded(_SITE)
def _optimizer_built(optimizer: Any) -> None:
    _loop.optimizer_built()
    _catch_failures(type(optimizer))


def _make_optimizer_init(original: Any) -> Any:
    """Our ``Optimizer.__init__``: a loop with an optimizer ends its steps at optimizer steps."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _optimizer_built(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


# Optimizer classes whose step() we wrapped, with the step() torch had given them.
_failure_catchers: list[tuple[type, Any]] = []


def _catch_failures(cls: type) -> None:
    """``cls.step`` (torch's hooked wrapper) inside one that ends the ``optimizer_step`` span
    of a call that raises, with the error: torch calls no post hook then."""
    step = cls.__dict__.get("step")
    if step is None or getattr(step, "_cirron_catches", False):
        return
    failed = guarded(_SITE)(_optimizer_failed)

    def catching(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return step(self, *args, **kwargs)
        except BaseException as error:
            failed(self, error)
            raise

    functools.update_wrapper(catching, step)  # keeps torch's `hooked` mark: no second wrap
    catching._cirron_catches = True  # type: ignore[attr-defined]
    _failure_catchers.append((cls, step))
    cls.step = catching  # type: ignore[attr-defined]


def _optimizer_failed(optimizer: Any, error: BaseException) -> None:
    entered = _optimizer_spans.pop(id(optimizer), None)
    if entered is not None:
        hook_spans.end(entered, error)


# -- GradScaler ----------------------------------------------------------------------
@guarded(_SITE)
def _scaler_begins() -> tuple[int, int]:
    return _loop.optimizer_steps, time.time_ns()


@guarded(_SITE)
def _scaler_ends(token: tuple[int, int], scaler: Any, optimizer: Any) -> None:
    """``GradScaler.step`` returned: if it skipped ``optimizer.step()``, that is still the
    step's optimizer moment, and the step says it was skipped, with the loss scale."""
    steps_before, started = token
    if _loop.optimizer_steps != steps_before:
        return  # it stepped: the optimizer hooks saw it
    scale = getattr(scaler, "_scale", None)
    attributes: dict[str, Any] = {"skipped": True}
    if scale is not None:
        # Read once per skipped step only, after GradScaler read found_inf itself
        # (so the device has nothing of ours to wait for).
        attributes["loss_scale"] = float(scale.item() if hasattr(scale, "item") else scale)
    _loop.skipped_step(attributes, sys._getframe(1))
    step = training.step_of(TORCH)
    hook_spans.record_on(
        step.opened[0] if step is not None else None,
        "optimizer_step",
        {"optimizer": type(optimizer).__name__, "skipped": True},
        started,
        time.time_ns(),
    )


def _make_scaler_step(original: Any) -> Any:
    """Our ``torch.amp.GradScaler.step`` (``torch.cuda.amp``'s too: a subclass)."""

    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        token = _scaler_begins()
        result = original(self, optimizer, *args, **kwargs)
        if token is not None:
            _scaler_ends(token, self, optimizer)
        return result

    step.__wrapped__ = original  # type: ignore[attr-defined]
    return functools.update_wrapper(step, original)


# -- data loading ------------------------------------------------------------------
def _pass_of(iterator: Any) -> LoaderPass:
    """The pass a DataLoader iterator begins (asked at its first fetch, and after a reset)."""
    training_now = _torch().is_grad_enabled() and (not _seen_models or _any_seen_model_training())
    sampler = getattr(iterator, "_index_sampler", None)
    loader_pass = LoaderPass(
        iterator,
        sampler if sampler is not None else iterator,
        training_now,
        loops.driven_by_batches(iterator),
    )
    setattr(iterator, _PASS, loader_pass)
    return loader_pass


_fetch_begins = guarded(_SITE)(lambda loader_pass, now: _loop.fetch_begins(loader_pass, now))
_fetch_ends = guarded(_SITE)(
    lambda loader_pass, started, outcome: _loop.fetch_ends(loader_pass, started, outcome)
)


def _make_next(original: Any) -> Any:
    time_ns = time.time_ns
    pass_of = guarded(_SITE)(_pass_of)

    def __next__(self: Any) -> Any:
        loader_pass = self.__dict__.get(_PASS) or pass_of(self)
        if loader_pass is None:  # the guard caught a failure: the batch still comes
            return original(self)
        started = time_ns()
        _fetch_begins(loader_pass, started)
        try:
            item = original(self)
        except StopIteration:
            _fetch_ends(loader_pass, started, EXHAUSTED)
            raise
        except Exception as error:
            _fetch_ends(loader_pass, started, error)
            raise
        _fetch_ends(loader_pass, started, None)
        return item

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    return __next__


def _make_reset(original: Any) -> Any:
    """Our ``_BaseDataLoaderIter._reset``: an iterator whose workers persist starts a new pass."""

    def _reset(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.pop(_PASS, None)
        return original(self, *args, **kwargs)

    _reset.__wrapped__ = original  # type: ignore[attr-defined]
    return _reset


_settle = guarded(_SITE)(lambda: _loop.settle())


@guarded(_SITE)
def _end_torch_moments() -> None:
    training.end_evaluation(TORCH)
    training.end_step(TORCH)
    training.end_epoch(TORCH)
    training.record_fetches(training.take_fetches())


class TorchInstrumentor(FrameworkInstrumentor):
    """OpenTelemetry instrumentor for PyTorch training loops (see the module docstring)."""

    modules = ("torch",)
    requirement = "torch >= 2.1"
    _handles: list[Any] = []  # the optimizer hooks

    def install(self, module: str) -> None:
        global _loop
        _loop = TorchLoop()
        torch = _torch()
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        module_class = torch.nn.Module
        self.patch(module_class, "__call__", _make_module_call(module_class.__dict__["__call__"]))
        self.patch(module_class, "train", _make_train(module_class.__dict__["train"]))
        self.patch(torch.autograd, "backward", _make_backward(torch.autograd.backward))
        self.patch(_BaseDataLoaderIter, "__next__", _make_next(_BaseDataLoaderIter.__next__))
        self.patch(_BaseDataLoaderIter, "_reset", _make_reset(_BaseDataLoaderIter._reset))
        optimizer_class = torch.optim.Optimizer
        self.patch(
            optimizer_class, "__init__", _make_optimizer_init(optimizer_class.__dict__["__init__"])
        )
        scaler_class = torch.amp.GradScaler
        self.patch(scaler_class, "step", _make_scaler_step(scaler_class.__dict__["step"]))
        self._handles.append(register_optimizer_step_pre_hook(_before_optimizer_step))
        self._handles.append(register_optimizer_step_post_hook(_after_optimizer_step))
        _cuda[0] = torch.cuda
        _grad_enabled[0] = torch.is_grad_enabled
        training_state.hooks.settle_fetches = _settle
        values.device_reader[0] = _device_value

    def remove(self) -> None:
        if recorder.current is not None:  # no hook will see another boundary: end ours
            _end_torch_moments()
        training_state.hooks.settle_fetches = training_state.nothing
        values.device_reader[0] = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for cls, step in reversed(_failure_catchers):
            cls.step = step  # type: ignore[attr-defined]
        _failure_catchers.clear()
        _optimizer_spans.clear()
        _seen_models.clear()
        _backward[0], _backward[1] = 0, None
        _cuda[0] = _grad_enabled[0] = None
