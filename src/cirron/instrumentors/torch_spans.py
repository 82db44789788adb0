"""The spans the torch hooks put around a call, with GPU time; and marks of GPU values.

Shared by the torch hooks (:mod:`.torch_modules`, :mod:`.torch_optim`,
:mod:`.torch_data`). Hook code runs behind the core guard
(:func:`cirron.recording.guard.guarded`) at each hook's entry points; the helpers it
calls are plain functions. The user's call a hook wraps (the forward, the
backward) runs outside the guard, so its exceptions reach the user unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from ..otel import semconv
from ..recording import hook_spans, hot
from ..recording.guard import guarded
from ..recording.hook_spans import HookSpan

SITE = "torch hook"  # how ci.health() names the torch hooks' failures
CUDA: list[Any] = [None]  # torch.cuda once attached: its _initialized flag says CUDA is in use


def torch_module() -> Any:
    """The torch the program imported (the hooks never import it themselves)."""
    return sys.modules["torch"]


def open_hook(name: str, attributes: dict[str, Any]) -> HookSpan | None:
    """Note the start of a hook span (built when it ends: :mod:`cirron.recording.hook_spans`).

    When CUDA is in use the span gets ``gpu_ns`` from a CUDA event pair,
    recorded on the current stream and read by the flush thread later
    (``Event.query()`` never waits), so the training stream is never
    synchronised. On a CPU-only run there is no attribute at all.
    """
    hook = hook_spans.begin(name, attributes)
    cuda = CUDA[0]
    if hook is not None and cuda is not None and cuda._initialized:
        _device_timer(hook)
    return hook


def _device_timer(hook: HookSpan) -> None:
    """``hook`` runs on CUDA, once it is initialized: it gets a timer of its device time."""
    if CUDA[0].is_initialized():
        hook.device_timer = _gpu_timer()


open_hook_pure = open_hook  # the pure-Python twin, the reference
if hot.compiled is not None:  # the same, compiled (it asks _device_timer once CUDA is on)
    hot.compiled.watch_device(CUDA, _device_timer)
    open_hook = hot.compiled.open_hook  # type: ignore[assignment]  # noqa: F811


close_guarded = guarded(SITE)(hook_spans.end)


def _recorded_event() -> Any:
    event = CUDA[0].Event(enable_timing=True)
    event.record()
    return event


def _gpu_timer() -> Any:
    """Record a start event now; the returned function records the end event when called."""
    start = _recorded_event()

    def stop() -> tuple[str, Any]:
        end = _recorded_event()
        return semconv.GPU_NS, lambda final: _elapsed_ns(start, end, final)

    return stop


def device_value(tensor: Any) -> Any:
    """How a mark reads a one-element CUDA tensor without waiting for the device.

    The value is copied to (pinned) host memory behind the work already queued
    on the current stream, and an event recorded after the copy; the flush
    thread reads it once the event has passed (``ci.trace()``, a flush or
    shutdown wait for it). None for other devices: read at the mark.
    """
    cuda = CUDA[0]
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
