"""DDP's gradient all-reduce as ``collective`` spans, through DDP's communication hook API.

DDP reduces each bucket of gradients inside ``backward``, in C++, out of Python's sight,
unless a communication hook is registered: then DDP calls the hook for each bucket. So:

- a hook the program registers (``ddp.register_comm_hook(state, hook)``) is registered
  wrapped: the program's hook runs unchanged, between the moment its bucket's span begins
  and the moment the future it returns completes;
- a DDP model with no hook by its first training forward gets one of cirron's that does
  what DDP's built-in reduction does, the same arithmetic in the same order (each gradient
  times ``1 / world size``, then a sum over the ranks), so gradients and losses are
  bit-identical with and without cirron. A hook the program registers later takes its place
  (DDP accepts one hook per model, and cirron's is already in).

Each bucket is a ``collective`` span under the backward it belongs to, with
``collective.op`` (``all_reduce``, or the collectives the program's hook called),
``collective.bytes`` (the bucket's), ``collective.bucket`` (its index),
``collective.group_size`` and ``collective.backend``. It ends when the bucket's reduction
is done (:mod:`.torch_collectives`): on a rank that was ready first it holds the wait
for the slowest.

Left alone (no bucket spans, DDP's own path): a model whose hook was registered before
cirron attached, a C++ built-in hook (``_register_builtin_comm_hook``), a model with
``gradient_as_bucket_view=True`` (DDP then divides in place where a hook cannot tell it
apart), sparse gradients, and compiled autograd's Python reducer.
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import Any

from ..otel import semconv
from ..recording import recorder
from ..recording.guard import guarded, report
from . import torch_collectives
from .torch_collectives import (
    begin,
    behind_device_work,
    finish,
    finish_guarded,
    hook_ops,
    hook_thread,
    when_done,
)
from .torch_spans import SITE, torch_module

ALL_REDUCE = "all_reduce"  # the op of DDP's own reduction
# DDP models seen: id -> the reduction cirron registered on it (None: left alone).
_models: dict[int, Reduction | None] = {}
# A hook of cirron's is on some DDP model: each backward's span is built when it begins,
# so that a bucket reduced on another thread (autograd's, on CUDA) finds its parent.
buckets_recorded = [False]


class Reduction:
    """The hook cirron registered on a DDP model: DDP's own reduction, with its span, until
    the program registers a hook of its own, which it then calls."""

    def __init__(self, model: Any) -> None:
        self.group = model.process_group
        self.group_size, self.backend = torch_collectives.group_facts(self.group)
        # DDP multiplies each gradient by 1.0 / size as it copies it into its bucket when no
        # hook is registered: the same product here, on the bucket, before the same sum.
        self.factor = 1.0 / self.group_size
        self.state: Any = None
        self.hook: Any = None  # the program's hook, once it registered one

    def use(self, state: Any, hook: Any) -> None:
        """The program registered a hook of its own: it runs from now on."""
        self.state, self.hook = state, hook

    def __call__(self, _state: Any, bucket: Any) -> Any:
        if self.hook is not None:
            return call_hook(self.hook, self.state, bucket, self.group_size, self.backend)
        buffer = bucket.buffer()
        pending = index = None
        if recorder.current is not None:
            try:  # the core guard, inline: once a bucket (its attributes come at its end)
                pending, index = begin({}, buffer.is_cuda, bucket=True), bucket.index()
            except Exception as failure:  # noqa: BLE001
                report(SITE, failure)
        buffer.mul_(self.factor)
        future = self.group.allreduce([buffer]).get_future()
        if pending is None:
            return future.then(_first_tensor)
        return future.then(functools.partial(self._reduced, pending, index, buffer))

    def _reduced(self, pending: Any, index: Any, buffer: Any, future: Any) -> Any:
        """The bucket's reduction is done (the backend's thread, once the ranks reduced): its
        span ends (on CUDA, once the device got there)."""
        end_ns = time.time_ns()
        try:
            reduced = future.value()[0]
        except BaseException as error:
            finish_guarded(pending, error, end_ns)
            raise
        try:  # the core guard, inline: once a bucket
            pending[2].update(_attributes(index, buffer, self.group_size, self.backend))
            if pending[4]:
                behind_device_work(pending)
            else:
                finish(pending, None, end_ns)
        except Exception as failure:  # noqa: BLE001
            report(SITE, failure)
        return reduced


def _first_tensor(future: Any) -> Any:
    return future.value()[0]


# -- one bucket ------------------------------------------------------------------------------
def _attributes(index: int, buffer: Any, group_size: int, backend: str) -> dict[str, Any]:
    return {
        semconv.COLLECTIVE_OP: ALL_REDUCE,
        semconv.COLLECTIVE_BYTES: int(buffer.nbytes),
        semconv.COLLECTIVE_BUCKET: int(index),
        semconv.COLLECTIVE_GROUP_SIZE: group_size,
        semconv.COLLECTIVE_BACKEND: backend,
    }


@guarded(SITE)
def _bucket_begins(bucket: Any, group_size: int, backend: str) -> Any:
    if isinstance(bucket, tuple):  # compiled autograd's Python reducer: (gradient, parameter)
        return None
    buffer = bucket.buffer()
    attributes = _attributes(bucket.index(), buffer, group_size, backend)
    return begin(attributes, bool(buffer.is_cuda), bucket=True)


@guarded(SITE)
def _hook_returned(pending: Any, future: Any, called: list[str]) -> None:
    # The op: the collectives the program's hook called, in order.
    pending[2][semconv.COLLECTIVE_OP] = ",".join(dict.fromkeys(called)) or "none"
    when_done(future, pending)  # (ends it now if it can't wait for the future)


def call_hook(hook: Any, state: Any, bucket: Any, group_size: int, backend: str) -> Any:
    """Call ``hook`` on ``bucket``; the bucket's span ends when the future it returns completes."""
    pending = _bucket_begins(bucket, group_size, backend)
    if pending is None:
        return hook(state, bucket)
    outer = hook_thread[0]
    hook_thread[0] = torch_collectives._thread_id()
    called_before = len(hook_ops)
    try:
        future = hook(state, bucket)
    except BaseException as error:
        finish_guarded(pending, error)
        raise
    finally:
        hook_thread[0] = outer
        called = hook_ops[called_before:]
        del hook_ops[called_before:]
    _hook_returned(pending, future, called)
    return future


def wrap(model: Any, hook: Any) -> Any:
    """``hook`` as DDP calls it, with the bucket's span around each call."""
    group_size, backend = torch_collectives.group_facts(model.process_group)

    def hook_with_span(state: Any, bucket: Any) -> Any:
        return call_hook(hook, state, bucket, group_size, backend)

    return functools.update_wrapper(hook_with_span, hook)


# -- DDP models --------------------------------------------------------------------------------
def _sparse(model: Any) -> bool:
    nn = torch_module().nn
    return any(
        isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse
        for module in model.modules()
    )


def _reduces_like_ddp(model: Any) -> bool:
    """Whether cirron's hook would do exactly what DDP does for ``model`` without one."""
    return not (
        model._comm_hooks  # the program's (or DDP's mixed precision's), before cirron attached
        or model.gradient_as_bucket_view
        or getattr(model, "_use_python_reducer", False)
        or _sparse(model)
    )


def _note(model: Any, reduction: Reduction | None) -> None:
    """Remember ``model`` (for as long as it lives), with cirron's hook on it or none."""
    key = id(model)
    if key not in _models:
        weakref.finalize(model, _models.pop, key, None)
    _models[key] = reduction


def watch_wrapped(module: Any) -> None:
    """A wrapper seen for the first time: cirron's hook on the DDP model it is or holds."""
    ddp = torch_module().nn.parallel.DistributedDataParallel
    for _ in range(4):  # torch.compile(DDP(model)), Lightning Fabric's module around DDP
        if isinstance(module, ddp):
            watch(module)
            return
        module = getattr(module, "_orig_mod", None) or getattr(module, "_forward_module", None)
        if module is None:
            return


def watch(model: Any) -> None:
    """A DDP model seen for the first time: cirron's hook on it, unless it has a hook."""
    if id(model) in _models:
        return
    _note(model, None)
    if not _reduces_like_ddp(model):
        return
    reduction = Reduction(model)
    try:
        torch_module().distributed._register_comm_hook(model.reducer, None, reduction)
    except RuntimeError:  # a built-in hook is registered already: DDP's path stays
        return
    _note(model, reduction)
    buckets_recorded[0] = True


def make_register_comm_hook(original: Any) -> Any:
    """Our ``DistributedDataParallel.register_comm_hook``: the program's hook, wrapped."""
    wrap_guarded = guarded(SITE)(wrap)

    def register_comm_hook(self: Any, state: object, hook: Any) -> None:
        reduction = _models.get(id(self))
        if reduction is not None:  # cirron's hook is in: the program's takes its place
            self._check_comm_hook(hook)
            reduction.use(state, hook)
            self._comm_hooks.append((hook, state))
            return None
        wrapped = wrap_guarded(self, hook)
        if id(self) not in _models:  # never cirron's hook on top of the program's
            _note(self, None)
        if wrapped is None:
            return original(self, state, hook)
        buckets_recorded[0] = True
        return original(self, state, wrapped)

    return functools.update_wrapper(register_comm_hook, original)


def make_register_builtin_comm_hook(original: Any) -> Any:
    """Our ``DistributedDataParallel._register_builtin_comm_hook``: after cirron's hook went in,
    the Python twin of the built-in one takes its place (DDP accepts one hook per model)."""

    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        reduction = _models.get(id(self))
        twin = _python_twin(comm_hook_type) if reduction is not None else None
        if twin is None:
            if id(self) not in _models:
                _note(self, None)
            return original(self, comm_hook_type)
        reduction.use(self.process_group, twin)  # type: ignore[union-attr]
        return None

    return functools.update_wrapper(_register_builtin_comm_hook, original)


def _python_twin(comm_hook_type: Any) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    twins = {
        "ALLREDUCE": default_hooks.allreduce_hook,
        "FP16_COMPRESS": default_hooks.fp16_compress_hook,
    }
    return twins.get(getattr(comm_hook_type, "name", ""))
