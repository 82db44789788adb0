"""PyTorch instrumentation: training steps, epochs, forward, backward, optimizer and data spans.

Installed by ``ci.profile()`` once the script imports torch, or on its own
with plain OpenTelemetry::

    from cirron.instrumentors.torch import TorchInstrumentor
    TorchInstrumentor().instrument(tracer_provider=provider)

What becomes a span:

- ``forward``: one per call of an *outermost* module (attribute ``mode`` =
  ``train``/``eval``, ``module`` = its class). Calls of its submodules are not
  spans and cost next to nothing. A loss module called on its own
  (``nn.CrossEntropyLoss()(out, y)``) is a ``loss`` span, not a second forward.
- ``backward``: ``loss.backward()`` and ``torch.autograd.backward(...)``.
- ``optimizer_step``: every ``optimizer.step()`` (global optimizer hooks).
- ``data_load``: the wait inside a DataLoader iterator's ``__next__``.
- ``step`` and ``epoch``: decided by ``cirron.training`` from these moments.

A training loader is one iterated with gradients enabled while the models
seen so far are in train mode; loaders under ``torch.no_grad()`` or
``model.eval()`` open no steps and no epochs.

Every hook runs through the core guard: a failure inside cirron is counted in
``ci.health()``, warned about once, and the training step runs on unchanged.
``uninstrument()`` restores every patched attribute and removes every hook.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.trace import get_current_span

from .. import loops, recorder, training
from ..guard import call_guarded, traced_call
from ..scopes import Scope, record_span
from ..watch import unwrap

_SITE = "torch hook"


class _ThreadState(threading.local):
    in_backward = False


_state = _ThreadState()
_inside_forward = [False]  # an outermost module call is running (any thread)
# Outermost modules seen so far (id -> weak reference): tells training loaders
# from validation ones. A dict, so the hot path only looks an int up.
_seen_models: dict[int, weakref.ref[Any]] = {}
_loader_kind: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_optimizer_scopes: dict[int, Any] = {}


def _torch() -> Any:
    return sys.modules["torch"]


# -- forward -----------------------------------------------------------------------
def _remember(module: Any) -> None:
    key = id(module)
    _seen_models[key] = weakref.ref(module, lambda _ref: _seen_models.pop(key, None))


def _any_seen_model_training() -> bool:
    models = [reference() for reference in list(_seen_models.values())]
    return any(model.training for model in models if model is not None)


def _cuda_in_use() -> bool:
    cuda = _torch().cuda
    return bool(cuda.is_initialized())


def _gpu_timed(
    site: str, name: str, attributes: dict[str, Any], function: Any, *args: Any, **kwargs: Any
) -> Any:
    """``traced_call``, plus ``gpu_ns`` from a CUDA event pair when CUDA is in use.

    The events are recorded on the current stream and read by the flush
    thread later (``Event.query()`` never waits), so the training stream is
    never synchronised. On a CPU-only run there is no attribute at all.
    """
    if not _cuda_in_use():
        return traced_call(site, name, attributes, function, *args, **kwargs)
    return traced_call(site, name, attributes, _timed_on_gpu, function, *args, **kwargs)


def _timed_on_gpu(function: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``function`` between two CUDA events; the current span gets their ``gpu_ns``."""
    span = get_current_span()
    start = call_guarded(_SITE, _recorded_event)
    result = function(*args, **kwargs)
    if start is not None:
        call_guarded(_SITE, _defer_gpu_time, span, start)
    return result


def _recorded_event() -> Any:
    event = _torch().cuda.Event(enable_timing=True)
    event.record()
    return event


def _defer_gpu_time(span: Any, start: Any) -> None:
    """Record the end event now; ``span`` gets ``gpu_ns`` once the GPU has got there."""
    end = _recorded_event()
    defer = getattr(span, "defer_attribute", None)
    if defer is not None:
        defer("gpu_ns", lambda final: _elapsed_ns(start, end, final))


def _elapsed_ns(start: Any, end: Any, final: bool) -> int | None:
    """GPU time between two recorded events; None while the GPU hasn't got there."""
    if not end.query():
        if not final:
            return None
        end.synchronize()  # flush or shutdown: worth waiting for, once
    return int(start.elapsed_time(end) * 1e6)


def _root_forward(module: Any, call: Any, args: Any, kwargs: Any) -> Any:
    """The outermost module call: a ``forward`` span (or ``loss`` for a loss module)."""
    torch = _torch()
    if isinstance(module, torch.nn.modules.loss._Loss):
        return traced_call(_SITE, "loss", {"module": type(module).__name__}, call, *args, **kwargs)
    training_mode = module.training
    try:
        if id(module) not in _seen_models:
            _remember(module)
        if training_mode and torch.is_grad_enabled():
            training.loop().training_activity()
    except Exception as error:  # noqa: BLE001 - the guard
        recorder.current_health().failed(_SITE, error)
    # A DDP / DataParallel / torch.compile wrapper is named for the model inside.
    model_class = type(unwrap(module)).__name__
    attributes = {"mode": "train" if training_mode else "eval", "module": model_class}
    return _gpu_timed(_SITE, "forward", attributes, call, *args, **kwargs)


def _make_module_call(original: Any) -> Any:
    """Our ``nn.Module.__call__``: a span for the outermost call only.

    Submodules take the first branch: it does what torch's own ``__call__``
    (``_wrapped_call_impl``) does, in the same single Python frame, after one
    read of a module-level flag, so a model of 400 modules pays ~400 flag
    reads per forward and nothing else. The flag is process-wide, not per
    thread: a module another thread calls while a forward runs is not a span
    of its own.
    """
    inline = getattr(original, "__name__", "") == "_wrapped_call_impl"
    inside = _inside_forward

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if inside[0]:
            if inline:
                compiled = self._compiled_call_impl
                if compiled is not None:
                    return compiled(*args, **kwargs)
                return self._call_impl(*args, **kwargs)
            return original(self, *args, **kwargs)
        inside[0] = True
        try:
            return _root_forward(self, original, (self, *args), kwargs)
        finally:
            inside[0] = False

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


_inside_train = [False]


def _make_train(original: Any) -> Any:
    """Our ``nn.Module.train``: ``model.eval()`` before the first forward tells us the mode."""

    def train(self: Any, mode: bool = True) -> Any:
        if _inside_train[0]:
            return original(self, mode)
        _inside_train[0] = True
        try:
            if id(self) not in _seen_models:
                call_guarded(_SITE, _remember, self)
            return original(self, mode)
        finally:
            _inside_train[0] = False

    train.__wrapped__ = original  # type: ignore[attr-defined]
    return train


# -- backward ----------------------------------------------------------------------
def _make_backward(original: Any, name: str) -> Any:
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _state.in_backward:  # Tensor.backward calls torch.autograd.backward
            return original(*args, **kwargs)
        _state.in_backward = True
        try:
            try:
                training.loop().training_activity()
            except Exception as error:  # noqa: BLE001 - the guard
                recorder.current_health().failed(_SITE, error)
            return _gpu_timed(_SITE, "backward", {}, original, *args, **kwargs)
        finally:
            _state.in_backward = False

    backward.__wrapped__ = original  # type: ignore[attr-defined]
    backward.__name__ = name
    return backward


# -- optimizer ---------------------------------------------------------------------
def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    stale = _optimizer_scopes.pop(id(optimizer), None)
    if stale is not None:  # the previous step() raised before its post hook
        stale[0].__exit__(RuntimeError, RuntimeError("optimizer.step() raised"), None)
    training.loop().training_activity()
    scope = Scope("optimizer_step", {"optimizer": type(optimizer).__name__})
    scope.__enter__()
    _optimizer_scopes[id(optimizer)] = (scope, _recorded_event() if _cuda_in_use() else None)


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    scope, start = _optimizer_scopes.pop(id(optimizer), (None, None))
    if scope is not None:
        if start is not None:
            _defer_gpu_time(scope.span, start)
        scope.__exit__(None, None, None)
    training.loop().optimizer_stepped()


# -- data loading ------------------------------------------------------------------
def _classify(iterator: Any) -> str:
    """``training``, ``eval``, or either with ``+batches`` when ``ci.batches`` drives it."""
    kind = _loader_kind.get(iterator)
    if kind is None:
        training_loader = _torch().is_grad_enabled() and (
            not _seen_models or _any_seen_model_training()
        )
        kind = "training" if training_loader else "eval"
        if loops.driven_by_batches(iterator):
            kind += "+batches"
        _loader_kind[iterator] = kind
    return kind


def _record_data_load(started_ns: int) -> None:
    """A ``data_load`` span for a fetch that began at ``started_ns`` and just ended."""
    record_span("data_load", {}, started_ns)


def _training_fetch(iterator: Any, started: int, driven_by_batches: bool) -> None:
    training.loop().training_fetch(iterator, started, driven_by_batches)


def _training_exhausted(iterator: Any) -> None:
    training.loop().training_loader_exhausted(iterator)


def _make_next(original: Any) -> Any:
    def __next__(self: Any) -> Any:
        kind = call_guarded(_SITE, _classify, self) or "eval"
        training_loader = kind.startswith("training")
        # Under ci.batches the batch spans are the steps and carry the wait as
        # data_load_ns: only the epoch boundaries are ours to find.
        driven = kind.endswith("+batches")
        started = time.time_ns()
        try:
            item = original(self)
        except StopIteration:
            # The last step ends where the loader runs dry; the fetch that only
            # found it empty is a data_load of the epoch, not of that step.
            if training_loader:
                call_guarded(_SITE, _training_exhausted, self)
            if not driven:
                call_guarded(_SITE, _record_data_load, started)
            _loader_kind.pop(self, None)  # a persistent-workers iterator starts over
            raise
        if training_loader:
            call_guarded(_SITE, _training_fetch, self, started, driven)
        if not driven:
            call_guarded(_SITE, _record_data_load, started)
        return item

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    return __next__


class TorchInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """OpenTelemetry instrumentor for PyTorch training loops (see the module docstring)."""

    # BaseInstrumentor is a singleton: __init__ runs on every TorchInstrumentor()
    # call, so the patch list lives on the class, not in __init__.
    _patches: list[tuple[Any, str, Any]] = []
    _handles: list[Any] = []
    _waiting_for_import = False

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.1",)

    def _instrument(self, **kwargs: Any) -> None:
        provider = kwargs.get("tracer_provider")
        if provider is not None and recorder.current is None:
            recorder.bind_provider(provider)
        if "torch" in sys.modules:
            self._attach()
        else:  # attach the moment the script imports torch, never import it ourselves
            import wrapt

            TorchInstrumentor._waiting_for_import = True
            wrapt.register_post_import_hook(self._attach_on_import, "torch")

    def _attach_on_import(self, _module: Any) -> None:
        if TorchInstrumentor._waiting_for_import:  # not uninstrumented meanwhile
            TorchInstrumentor._waiting_for_import = False
            self._attach()

    def _patch(self, owner: Any, attribute: str, replacement: Any) -> None:
        original = owner.__dict__[attribute]
        self._patches.append((owner, attribute, original))
        setattr(owner, attribute, replacement)

    def _attach(self) -> None:
        if self._patches:
            return
        try:
            self._install_patches()
        except BaseException:
            self._uninstrument()  # all or nothing: never leave torch half patched
            raise

    def _install_patches(self) -> None:
        torch = _torch()
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        module_class = torch.nn.Module
        self._patch(module_class, "__call__", _make_module_call(module_class.__dict__["__call__"]))
        self._patch(module_class, "train", _make_train(module_class.__dict__["train"]))
        self._patch(torch.Tensor, "backward", _make_backward(torch.Tensor.backward, "backward"))
        self._patch(torch.autograd, "backward", _make_backward(torch.autograd.backward, "backward"))
        self._patch(_BaseDataLoaderIter, "__next__", _make_next(_BaseDataLoaderIter.__next__))
        self._handles.append(
            register_optimizer_step_pre_hook(
                lambda o, a, k: call_guarded(_SITE, _before_optimizer_step, o, a, k)
            )
        )
        self._handles.append(
            register_optimizer_step_post_hook(
                lambda o, a, k: call_guarded(_SITE, _after_optimizer_step, o, a, k)
            )
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        TorchInstrumentor._waiting_for_import = False
        rec = recorder.current
        state = rec.extras.get("training_loop") if rec is not None else None
        if state is not None:  # no hook will see another boundary: end the open epoch
            call_guarded(_SITE, state.close)
        for owner, attribute, original in reversed(self._patches):
            setattr(owner, attribute, original)
        self._patches.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        _optimizer_scopes.clear()
        _seen_models.clear()
