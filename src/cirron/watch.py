"""``ci.watch(model)``: register models for weight and gradient snapshots.

Models are held by weak reference on the current recorder, each under its own
name (class name, or the name given; ``Generator``, ``Generator_1``, ...).
Wrappers are unwrapped so the snapshot sees the real parameters:
``DistributedDataParallel`` / ``DataParallel`` (``.module``) and
``torch.compile`` (``._orig_mod``).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from . import recorder


def _is_torch_module(model: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def _is_keras_model(model: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, getattr(keras, "Model", ()))


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


def watch(model: Any, name: str | None = None) -> None:
    """Register ``model`` so its weights and gradients are captured at epoch boundaries.

    Call once per model after ``ci.profile()``; several models (a GAN's two)
    are fine. ``model`` must be a ``torch.nn.Module`` (DDP, DataParallel and
    ``torch.compile`` wrappers included) or a Keras model.
    """
    if not (_is_torch_module(model) or _is_keras_model(model)):
        raise TypeError(
            f"ci.watch() needs a torch.nn.Module (or a Keras model), got {type(model).__name__}"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    model = unwrap(model)
    rec = recorder.current or recorder.active()
    watched: dict[str, weakref.ref[Any]] = rec.extras.setdefault("watched", {})
    if any(reference() is model for reference in watched.values()):
        return  # already watched
    base = name or type(model).__name__
    unique, counter = base, 1
    while unique in watched:
        unique, counter = f"{base}_{counter}", counter + 1
    watched[unique] = weakref.ref(model)
    if rec.enabled:
        from . import snapshots

        snapshots.prepare(model)


def watched_models() -> dict[str, Any]:
    """The live watched models by name."""
    rec = recorder.current
    if rec is None:
        return {}
    references: dict[str, weakref.ref[Any]] = rec.extras.get("watched", {})
    return {name: ref() for name, ref in references.items() if ref() is not None}
