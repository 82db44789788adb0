"""The torch hooks around communication: a ``collective`` span per ``torch.distributed``
collective, a DDP gradient bucket's (:mod:`.torch_comm_hooks`) or one the program calls.

Patched, as the program calls them (``dist.all_reduce(...)``): ``all_reduce``,
``broadcast``, ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
``reduce_scatter_tensor``, ``all_gather_single``, ``reduce_scatter_single`` (FSDP2's) and
``barrier``, those of them the installed torch has. Each call is a ``collective`` span under the
current span, with ``collective.op`` (the function's name), ``collective.bytes`` (what
this rank sends: the tensor, or the list of tensors, it contributes), ``collective.group_size``
and ``collective.backend``; a DDP bucket's adds ``collective.bucket``.

**When it ends.** A span ends when the work is done, which is what a rank waiting for
the others sees:

- on CPU (gloo), a blocking call when it returns; an ``async_op=True`` call, and a DDP
  bucket, when its future completes (a callback on the backend's thread);
- on CUDA (NCCL), the call returns once the work is queued on the device, so a CUDA event
  is recorded behind it (on the stream that waits for the work) and a thread of ours
  waits for that event (``Event.synchronize()`` blocks that thread only); the span ends
  then. The training stream is never synchronised.

A collective a DDP communication hook calls is the bucket's span, not one of its own.
Every hook runs behind the core guard; the collective itself runs outside it, so its
exceptions reach the program unchanged (the span then ends with the error).
"""

from __future__ import annotations

import collections
import functools
import os
import queue
import threading
import time
from typing import Any

from ..otel import semconv
from ..otel.spans import SPAN_KEY, context_variable
from ..otel.threads import daemon_thread
from ..recording import hook_spans, recorder, training_state
from ..recording.guard import guarded, report
from .torch_spans import CUDA, SITE, torch_module

# The functions patched, and where their arguments hold (the position and keyword of)
# what this rank sends, and (the position of) the process group. Whether a call is
# async_op=True is told by what it returns: a Work.
OPS: dict[str, tuple[int | None, str, int]] = {
    "all_reduce": (0, "tensor", 2),
    "broadcast": (0, "tensor", 2),
    "all_gather": (1, "tensor", 2),
    "all_gather_into_tensor": (1, "input_tensor", 2),
    "reduce_scatter": (1, "input_list", 3),
    "reduce_scatter_tensor": (1, "input", 3),
    "all_gather_single": (1, "input_tensor", 2),  # (what FSDP2 calls, where torch has them)
    "reduce_scatter_single": (1, "input", 3),
    "barrier": (None, "", 0),
}
GROUP = "group"  # the keyword of the process group, in every one of them

_context_var = context_variable()
_open_hooks = training_state.open_hook_spans
_time_ns = time.time_ns
_thread_id = threading.get_ident
# The backwards running now, innermost last, as (their hook span, their span): a DDP
# bucket's parent, on whatever thread autograd calls its hook (on CUDA, not the training one).
running_backwards: list[tuple[Any, Any]] = []
# The thread a DDP communication hook runs on now, and the collectives it called: those
# are the bucket's span, not spans of their own.
hook_thread: list[int | None] = [None]
hook_ops: list[str] = []
# Facts of the process groups seen: id -> (the group, its size, its backend).
_groups: dict[int, tuple[Any, int, str]] = {}
_waiter: list[Any] = [None]  # the thread that waits for CUDA events, once started
# Collectives begun and not ended yet: what settle() waits for before the hooks come off.
# One item per collective (deque's append and pop are atomic: no lock on this path), and
# per DDP bucket on the host, which its backward waits for (see backward_ends).
_in_flight: collections.deque[None] = collections.deque()
_host_buckets: collections.deque[None] = collections.deque()
BUCKETS_SETTLE_S = 0.05  # the most a backward's end waits for its buckets' callbacks
SETTLE_S = 1.0  # the most settle() waits

# (recorder, parent, attributes, start, on CUDA, a DDP bucket on the host)
Pending = tuple[Any, Any, dict[str, Any], int, bool, bool]


# -- a collective begins and ends ------------------------------------------------------------
def begin(attributes: dict[str, Any], cuda: bool, bucket: bool = False) -> Pending | None:
    """Note a collective that starts now, under the backward it belongs to (a DDP bucket)
    or the current span; None when nothing is recorded."""
    rec = recorder.current
    if rec is None or not rec.enabled or not rec.training.detail:
        return None
    if running_backwards:
        parent = running_backwards[-1][1]
    else:
        if _open_hooks:  # inside a forward: that forward is built, and holds the collective
            hook_spans.build_here()
        parent = _context_var.get().get(SPAN_KEY)
    _in_flight.append(None)
    host_bucket = bucket and not cuda
    if host_bucket:
        _host_buckets.append(None)
    return rec, parent, attributes, _time_ns(), cuda, host_bucket


def finish(pending: Pending, error: BaseException | None = None, end_ns: int | None = None) -> None:
    """The collective is done (any thread): its span, from its start to ``end_ns`` (now)."""
    end_ns = end_ns if end_ns is not None else _time_ns()
    rec, parent, attributes, start_ns, _cuda, _bucket = pending
    try:
        if recorder.current is rec:  # (not when profiling ended meanwhile)
            hook_spans.record_on(parent, semconv.COLLECTIVE, attributes, start_ns, end_ns, error)
    finally:
        if _in_flight:
            _in_flight.pop()
        if pending[5] and _host_buckets:
            _host_buckets.pop()


def settle(timeout: float = SETTLE_S) -> None:
    """Wait (up to ``timeout``) for the collectives still in flight to end: the callback of a
    DDP bucket that just completed runs on the backend's thread, and needs the interpreter
    the exit holds."""
    deadline = time.monotonic() + timeout
    while _in_flight and time.monotonic() < deadline:
        time.sleep(0.001)


finish_guarded = guarded(SITE)(finish)


def when_done(future: Any, pending: Pending) -> None:
    """End ``pending`` when ``future`` completes (on CUDA: when the device got there); now,
    if a callback can't be added."""

    def done(completed: Any) -> None:
        end_ns = _time_ns()
        try:
            error = None
            try:
                completed.value()  # raises what the work failed with
            except Exception as failed:  # noqa: BLE001 - the collective's error, for its span
                error = failed
            if pending[4] and error is None:
                behind_device_work(pending)
            else:
                finish(pending, error, end_ns)
        except Exception as failure:  # noqa: BLE001 - the core guard, on the backend's thread
            report(SITE, failure)

    try:
        future.add_done_callback(done)
    except Exception:
        finish(pending)
        raise


def behind_device_work(pending: Pending) -> None:
    """Record a CUDA event on the current stream (it waits for the collective) and have
    the waiting thread end ``pending`` once the device has passed it."""
    try:
        event = CUDA[0].Event()
        event.record()
        waiter = _waiter[0]
        if waiter is None:
            waiter = _waiter[0] = _start_waiter()
    except Exception:
        finish(pending)
        raise
    waiter.put((event, pending))


def _start_waiter() -> queue.SimpleQueue[Any]:
    waiting: queue.SimpleQueue[Any] = queue.SimpleQueue()
    thread = daemon_thread(_wait_for_events, "cirron-collectives", (waiting,))
    thread.start()
    return waiting


def _wait_for_events(waiting: queue.SimpleQueue[Any]) -> None:
    while True:
        event, pending = waiting.get()
        try:
            event.synchronize()  # this thread only: the GIL is released while it waits
        except Exception as error:  # noqa: BLE001 - the core guard, on our thread
            report(SITE, error)
        finish_guarded(pending)


def _forget_in_child() -> None:
    """A forked child has no waiting thread (and records no collective of its parent's)."""
    _waiter[0] = None
    running_backwards.clear()
    _in_flight.clear()
    _host_buckets.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# -- the backward a DDP bucket belongs to ------------------------------------------------------
def backward_begins(hook: Any) -> None:
    """A backward of a model DDP reduces began (``hook``: its noted span): its span is built
    now, so that buckets reduced on autograd's threads can be its children."""
    hook_spans.build_here()
    running_backwards.append((hook, _context_var.get().get(SPAN_KEY)))


def backward_ends(hook: Any) -> None:
    """The backward returned. On the host, DDP waited in it for its buckets' reductions, whose
    callbacks (each a bucket's span) need the interpreter this thread holds: let them run
    now, so that each span ends when its reduction did, and is there once backward returns."""
    if running_backwards and running_backwards[-1][0] is hook:
        running_backwards.pop()
    if _host_buckets:
        deadline = time.monotonic() + BUCKETS_SETTLE_S
        while _host_buckets and time.monotonic() < deadline:
            time.sleep(0)  # the interpreter to the backend's threads, for a moment


# -- what a collective is ------------------------------------------------------------------
def group_facts(group: Any) -> tuple[int, str]:
    """(size, backend) of ``group`` (None: the default group), read once per group."""
    dist = torch_module().distributed
    if group is None:
        group = dist.group.WORLD
    known = _groups.get(id(group))
    if known is not None and known[0] is group:
        return known[1], known[2]
    size, backend = dist.get_world_size(group), str(dist.get_backend(group))
    _groups[id(group)] = (group, size, backend)
    return size, backend


def payload_bytes(payload: Any) -> int:
    """The bytes of a tensor, or of a list of tensors."""
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(item) for item in payload)
    return int(getattr(payload, "nbytes", 0))


def _is_cuda(payload: Any) -> bool:
    if isinstance(payload, (list, tuple)):
        return bool(payload) and _is_cuda(payload[0])
    return bool(getattr(payload, "is_cuda", False))


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, keyword: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(keyword)


@guarded(SITE)
def _begin_call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Pending | None:
    payload_index, payload_keyword, group_index = OPS[name]
    payload = (
        _argument(args, kwargs, payload_index, payload_keyword)
        if payload_index is not None
        else None
    )
    size, backend = group_facts(_argument(args, kwargs, group_index, GROUP))
    attributes = {
        semconv.COLLECTIVE_OP: name,
        semconv.COLLECTIVE_BYTES: payload_bytes(payload),
        semconv.COLLECTIVE_GROUP_SIZE: size,
        semconv.COLLECTIVE_BACKEND: backend,
    }
    return begin(attributes, _is_cuda(payload))


@guarded(SITE)
def _returned(pending: Pending, result: Any) -> None:
    """The call returned ``result`` (a Work for ``async_op=True``, else None)."""
    if result is None and not pending[4]:  # a blocking call on CPU: done
        finish(pending)
        return
    if result is not None and hasattr(result, "get_future"):
        try:
            future = result.get_future()
        except RuntimeError:  # a backend without futures for this work: ends as it returns
            future = None
        if future is not None:
            when_done(future, pending)
            return
    if pending[4]:
        behind_device_work(pending)
    else:
        finish(pending)


def make_collective(original: Any, name: str) -> Any:
    """Our ``torch.distributed.<name>``: a ``collective`` span around ``original``."""

    def collective(*args: Any, **kwargs: Any) -> Any:
        inside_hook = hook_thread[0]
        if inside_hook is not None and inside_hook == _thread_id():  # a DDP bucket's
            hook_ops.append(name)
            return original(*args, **kwargs)
        pending = _begin_call(name, args, kwargs) if recorder.current is not None else None
        if pending is None:
            return original(*args, **kwargs)
        try:
            result = original(*args, **kwargs)
        except BaseException as error:
            finish_guarded(pending, error)
            raise
        _returned(pending, result)
        return result

    return functools.update_wrapper(collective, original)


def forget() -> None:
    """The hooks come off."""
    running_backwards.clear()
    hook_thread[0] = None
    hook_ops.clear()
    _groups.clear()
