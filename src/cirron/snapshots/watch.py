"""``ci.watch(model)``: register models for weight and gradient snapshots.

Models are held by weak reference on the current recorder, each under its own
name (class name, or the name given; ``Generator``, ``Generator_1``, ...).
A model is any object a framework's snapshot adapter claims (a
``torch.nn.Module``, a Keras model); the adapter unwraps what wraps the real
parameters (``DistributedDataParallel``, ``DataParallel``, ``torch.compile``).
Framework hooks that find the model themselves (a Trainer's) register it here
too, with :func:`register`.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..recording import recorder
from . import capture as snapshots


def watch(model: Any, name: str | None = None) -> None:
    """Register ``model`` so its weights and gradients are captured at epoch boundaries.

    Call once per model after ``ci.profile()``; several models (a GAN's two)
    are fine. ``model`` must be a ``torch.nn.Module`` (DDP, DataParallel and
    ``torch.compile`` wrappers included) or a Keras model or layer.
    """
    if snapshots.adapter_for(model) is None:
        raise TypeError(
            "ci.watch() needs a torch.nn.Module or a Keras model for model, "
            f"got {type(model).__name__}"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    register(model, name)


def register(model: Any, name: str | None = None) -> str | None:
    """Watch ``model`` (unwrapped) under ``name`` or its class name; its name, None if unknown."""
    adapter = snapshots.adapter_for(model)
    if adapter is None:
        return None
    model = adapter.unwrap(model)
    rec = recorder.current or recorder.active()
    watched = rec.watched
    for known, reference in list(watched.items()):
        if reference() is model:
            return known  # already watched
    base = name or type(model).__name__
    unique, counter = base, 1
    while unique in watched:
        unique, counter = f"{base}_{counter}", counter + 1
    watched[unique] = weakref.ref(model)
    if rec.enabled:
        snapshots.prepare(model)
    return unique


def watched_models() -> dict[str, Any]:
    """The live watched models of the current recorder, by name."""
    rec = recorder.current
    return rec.watched_models() if rec is not None else {}


def watch_for_run(model: Any) -> str | None:
    """Watch ``model`` for a framework's run (:meth:`FrameworkRun.watching`): the name it is
    newly watched under; None when it was watched already (``ci.watch``) or can't be."""
    rec = recorder.current or recorder.active()
    before = set(rec.watched)
    name = register(model)
    return name if name is not None and name not in before else None
