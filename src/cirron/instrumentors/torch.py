"""PyTorch instrumentation: training steps, epochs, forward, backward, optimizer and data spans.

Installed by ``ci.profile()`` once the script imports torch, or on its own
with plain OpenTelemetry::

    from cirron.instrumentors.torch import TorchInstrumentor
    TorchInstrumentor().instrument(tracer_provider=provider)

What becomes a span:

- ``forward``: one per call of an *outermost* module (attribute ``mode`` =
  ``train``/``eval``, ``module`` = its class). Calls of its submodules are not
  spans and cost next to nothing. A loss module called on its own
  (``nn.CrossEntropyLoss()(out, y)``) is not a span: its time is the gap
  between ``forward`` and ``backward`` in the step.
- ``backward``: ``loss.backward()`` and ``torch.autograd.backward(...)`` (one
  patch of the latter: ``Tensor.backward`` calls it).
- ``optimizer_step``: every ``optimizer.step()`` (global optimizer hooks).
- ``data_load``: the wait inside a DataLoader iterator's ``__next__``.
- ``step`` and ``epoch``: found from these moments by :mod:`.torch_steps`
  and reported to :mod:`cirron.training`, which opens them unless a higher
  owner (``ci.epochs``/``ci.batches``, HF Trainer, Keras) has them.

A training loader is one iterated with gradients enabled while the models
seen so far are in train mode; loaders under ``torch.no_grad()`` or
``model.eval()`` open no steps and no epochs.

Every hook runs through the core guard: a failure inside cirron is counted in
``ci.health()``, warned about once, and the training step runs on unchanged.
``uninstrument()`` restores every patched attribute and removes every hook.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from .. import hook_spans, loops, recorder, training
from ..guard import guarded
from ..hook_spans import HookSpan
from . import FrameworkInstrumentor
from .torch_steps import TORCH, TorchLoop

_SITE = "torch hook"


_inside_forward = False  # an outermost module call is running (any thread)
_loss_class: list[Any] = [None]  # torch.nn.modules.loss._Loss once attached
_inside_train = [False]
# Outermost modules seen so far: id -> (weak reference, class name of the model
# inside any DDP / compile wrapper). Tells training loaders from validation
# ones; a dict, so the hot path only looks an int up.
_seen_models: dict[int, tuple[weakref.ref[Any], str]] = {}
_loader_kind: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_last_loader: list[Any] = [None, None]  # (iterator, kind): most fetches come from the same one
# The batch samplers of loaders that fed training: a DataLoader's iterators all
# share its sampler, so its next pass is training even if the model is still in
# eval mode from a validation run when the first batch is fetched (HF Trainer
# fetches a step's batches before it calls model.train()).
_training_samplers: weakref.WeakSet[Any] = weakref.WeakSet()
_optimizer_spans: dict[int, HookSpan] = {}
_cuda: list[Any] = [None]  # torch.cuda once attached: its _initialized flag says CUDA is in use
_grad_enabled: list[Any] = [None]  # torch.is_grad_enabled once attached
_loop = TorchLoop()  # what the hooks have seen of the loop (new at every attach)


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


def _elapsed_ns(start: Any, end: Any, final: bool) -> int | None:
    """GPU time between two recorded events; None while the GPU hasn't got there."""
    if not end.query():
        if not final:
            return None
        end.synchronize()  # flush or shutdown: worth waiting for, once
    return int(start.elapsed_time(end) * 1e6)


# -- forward -----------------------------------------------------------------------
def unwrap(model: Any) -> Any:
    """The model inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        name = type(model).__name__
        inner = None
        if name == "OptimizedModule":  # torch.compile
            inner = getattr(model, "_orig_mod", None)
        elif name in ("DistributedDataParallel", "DataParallel"):
            inner = getattr(model, "module", None)
        if inner is None:
            return model
        model = inner


def _remember(module: Any) -> tuple[weakref.ref[Any], str]:
    key = id(module)
    # A DDP / DataParallel / torch.compile wrapper is named for the model inside.
    entry = _seen_models[key] = (
        weakref.ref(module, lambda _ref: _seen_models.pop(key, None)),
        type(unwrap(module)).__name__,
    )
    return entry


def _any_seen_model_training() -> bool:
    models = [entry[0]() for entry in list(_seen_models.values())]
    return any(model.training for model in models if model is not None)


@guarded(_SITE)
def _open_forward(module: Any) -> HookSpan | None:
    """The ``forward`` span of an outermost call, after telling the loop what work it is."""
    entry = _seen_models.get(id(module)) or _remember(module)
    if module.training and _grad_enabled[0]():
        _loop.training_work()
        return _open("forward", {"mode": "train", "module": entry[1]})
    _loop.evaluation_work()
    return _open("forward", {"mode": "train" if module.training else "eval", "module": entry[1]})


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
            _close_guarded(entered, error)
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
        try:
            result = original(*args, **kwargs)
        except BaseException as error:
            _close_backward(entered, error)
            raise
        _close_backward(entered)
        return result

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    backward.__name__ = "backward"
    return backward


# -- optimizer ---------------------------------------------------------------------
@guarded(_SITE)
def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    stale = _optimizer_spans.pop(id(optimizer), None)
    if stale is not None:  # the previous step() raised before its post hook
        hook_spans.end(stale, RuntimeError("optimizer.step() raised"))
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
def _optimizer_built() -> None:
    _loop.optimizer_built()


def _make_optimizer_init(original: Any) -> Any:
    """Our ``Optimizer.__init__``: a loop with an optimizer ends its steps at optimizer steps."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _optimizer_built()

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


# -- data loading ------------------------------------------------------------------
# A loader's kind (see _classify), tested by set membership on every fetch.
_TRAINING = frozenset({"training", "training+batches"})
_DRIVEN = frozenset({"training+batches", "eval+batches"})


def _classify(iterator: Any) -> str:
    """``training``, ``eval``, or either with ``+batches`` when ``ci.batches`` drives it.

    The fetch hook asks only when the iterator is not the previous fetch's.
    """
    kind = _loader_kind.get(iterator)
    if kind is None:
        sampler = getattr(iterator, "_index_sampler", None)
        training_loader = _torch().is_grad_enabled() and (
            not _seen_models or _fed_training(sampler) or _any_seen_model_training()
        )
        if training_loader:
            _remember_training(sampler)
        kind = "training" if training_loader else "eval"
        if loops.driven_by_batches(iterator):
            kind += "+batches"
        _loader_kind[iterator] = kind
    _last_loader[0], _last_loader[1] = iterator, kind
    return kind


def _fed_training(sampler: Any) -> bool:
    try:
        return sampler in _training_samplers
    except TypeError:  # not weakly referenceable
        return False


def _remember_training(sampler: Any) -> None:
    try:
        _training_samplers.add(sampler)
    except TypeError:
        pass


def _forget(iterator: Any) -> None:
    """A persistent-workers iterator starts over: classify its next pass afresh."""
    _loader_kind.pop(iterator, None)
    if _last_loader[0] is iterator:
        _last_loader[0] = _last_loader[1] = None


@guarded(_SITE)
def _after_fetch(iterator: Any, kind: str, started: int, exhausted: bool) -> None:
    """Tell the loop about a fetch that began at ``started``; record its data_load."""
    # Under ci.batches the batch spans are the steps and carry the wait as
    # data_load_ns: only the epoch boundaries are ours to find.
    driven = kind in _DRIVEN
    if kind in _TRAINING:
        if exhausted:
            # The last step ends where the loader runs dry; the fetch that only
            # found it empty is a data_load of the epoch, not of that step.
            _loop.training_loader_exhausted(driven)
        else:
            _loop.training_fetch(iterator, started, driven)
    if not driven:
        hook_spans.record("data_load", {}, started)
    if exhausted:
        _forget(iterator)


def _make_next(original: Any) -> Any:
    time_ns = time.time_ns
    classify = guarded(_SITE)(_classify)

    def __next__(self: Any) -> Any:
        # Most fetches come from the loader of the previous one: no call for them.
        kind = _last_loader[1] if self is _last_loader[0] else classify(self)
        if kind is None:  # the guard caught a failure: the batch still comes
            return original(self)
        started = time_ns()
        try:
            item = original(self)
        except StopIteration:
            _after_fetch(self, kind, started, exhausted=True)
            raise
        _after_fetch(self, kind, started, exhausted=False)
        return item

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    return __next__


@guarded(_SITE)
def _end_torch_moments() -> None:
    training.end_step(TORCH)
    training.end_epoch(TORCH)


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
        optimizer_class = torch.optim.Optimizer
        self.patch(
            optimizer_class, "__init__", _make_optimizer_init(optimizer_class.__dict__["__init__"])
        )
        self._handles.append(register_optimizer_step_pre_hook(_before_optimizer_step))
        self._handles.append(register_optimizer_step_post_hook(_after_optimizer_step))
        _cuda[0] = torch.cuda
        _grad_enabled[0] = torch.is_grad_enabled

    def remove(self) -> None:
        if recorder.current is not None:  # no hook will see another boundary: end ours
            _end_torch_moments()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        _optimizer_spans.clear()
        _seen_models.clear()
        _training_samplers.clear()
        _last_loader[0] = _last_loader[1] = None
        _cuda[0] = _grad_enabled[0] = None
