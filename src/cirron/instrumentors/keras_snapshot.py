"""Snapshots of Keras models: the adapter behind :mod:`cirron.snapshots.capture` for Keras layers.

A Keras model (or any layer) found by the Keras callback, or given to
``ci.watch``, is snapshotted variable by variable (``model.weights``: the
trainable ones, then BatchNorm's moving statistics and the like, each event
with ``trainable`` true or false). Each event is named by the variable's
path (``sequential/dense_1/kernel`` in Keras 3; ``dense_1/kernel`` in Keras
2, its name without ``:0``), made unique within the snapshot with ``_1``,
``_2`` where two variables share one. Raw tensors are written with the same
names.

Gradients: captured on the torch backend, where Keras leaves each
variable's gradient on its tensor after the step (``.grad``, until the next
step clears it), so a boundary sees the last batch's. Not on the TensorFlow
and JAX backends: there the gradients live only inside the compiled train
step, which applies and drops them; keeping them would add an output per
variable to every step, not just to the boundaries. Optimizer state (Adam's
moments) is not captured.

On the training thread, only the copies (``Variable.numpy()`` copies on
TensorFlow; the torch backend's tensors are copied out); the statistics are
computed with NumPy on the snapshot thread.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ..otel import semconv
from ..snapshots.records import HISTOGRAM_BINS, TensorRecord, empty_summary

_FLAVORS = ("keras", "tf_keras")  # Keras 3 (or 2) as `keras`, Keras 2 as `tf_keras`


def _numpy() -> Any:
    import numpy  # Keras depends on it: imported by the time there is a Keras model

    return numpy


def _layer_classes() -> tuple[type, ...]:
    classes = []
    for name in _FLAVORS:
        module = sys.modules.get(name)
        layers = getattr(module, "layers", None) if module is not None else None
        if layers is not None and isinstance(getattr(layers, "Layer", None), type):
            classes.append(layers.Layer)
    return tuple(classes)


# -- statistics (the snapshot thread) ------------------------------------------------------
def summarise(array: Any) -> list[float]:
    """The summary of ``array`` (see :mod:`cirron.snapshots.records`), computed with NumPy."""
    np = _numpy()
    x = np.asarray(array).reshape(-1)
    if np.iscomplexobj(x):
        x = x.view(x.real.dtype)  # stats over the components
    if x.dtype not in (np.float32, np.float64):
        is_float = np.issubdtype(x.dtype, np.floating) or x.dtype.kind == "V"
        x = x.astype(np.float32 if is_float else np.float64)  # float16, bfloat16; ints exact
    if x.size == 0:
        return empty_summary()
    low, high = float(x.min()), float(x.max())
    nan_count = inf_count = 0
    if not (math.isfinite(low) and math.isfinite(high)):  # NaN or inf somewhere
        finite = np.isfinite(x)
        nan_count = int(np.isnan(x).sum())
        inf_count = int(x.size - finite.sum()) - nan_count
        x = x[finite]
        if x.size == 0:
            return empty_summary(nan_count, inf_count)
        low, high = float(x.min()), float(x.max())
    count = x.size
    mean = float(x.sum(dtype=np.float64)) / count
    centred = x.astype(np.float64) - mean
    m2 = float(np.dot(centred, centred))
    if high > low:
        histogram = np.histogram(x, bins=HISTOGRAM_BINS, range=(low, high))[0].tolist()
    else:
        histogram = [count] + [0] * (HISTOGRAM_BINS - 1)
    return [float(count), float(nan_count), float(inf_count), mean, m2, low, high] + [
        float(v) for v in histogram
    ]


# -- the capture (the training thread) -------------------------------------------------------
def _name(variable: Any) -> str:
    name = getattr(variable, "path", None) or variable.name
    return name[:-2] if name.endswith(":0") else name


def _copy(value: Any) -> Any:
    """A NumPy copy of a variable's value or a gradient, taken now."""
    np = _numpy()
    if hasattr(value, "detach"):  # a torch tensor (torch backend): numpy() would share it
        return value.detach().cpu().numpy().copy()
    numpy = getattr(value, "numpy", None)
    if numpy is not None:  # a Keras or TensorFlow variable: numpy() is a copy
        return numpy()
    return np.array(value, copy=True)


def _gradient(variable: Any) -> Any:
    """The gradient the torch backend left on ``variable``'s tensor, or None."""
    value = getattr(variable, "value", None)
    return getattr(value, "grad", None) if hasattr(value, "detach") else None


def _unique(name: str, taken: set[str]) -> str:
    unique, counter = name, 1
    while unique in taken:
        unique, counter = f"{name}_{counter}", counter + 1
    taken.add(unique)
    return unique


class KerasCapture:
    """The variables of one model at one boundary, copied."""

    def __init__(self, model: Any, raw: bool) -> None:
        self._tensors: list[tuple[str, str, bool | None, Any]] = []  # name, kind, trainable, copy
        weights = list(model.trainable_weights) + list(model.non_trainable_weights)
        taken: set[str] = set()
        gradients = []
        for variable in weights:
            name = _unique(_name(variable), taken)
            trainable = bool(getattr(variable, "trainable", True))
            self._tensors.append((name, semconv.KIND_WEIGHT, trainable, _copy(variable)))
            gradient = _gradient(variable)
            if gradient is not None:
                gradients.append((name, semconv.KIND_GRADIENT, None, _copy(gradient)))
        self._tensors += gradients
        self.tensor_count = len(self._tensors)

    def save(self, kind: str, path: str, metadata: dict[str, str]) -> bool:
        tensors = {name: copy for name, k, _, copy in self._tensors if k == kind}
        if not tensors:
            return False
        from safetensors.numpy import save_file  # only ever needed for raw tensors

        save_file(tensors, path, metadata=metadata)
        return True

    def records(self) -> list[TensorRecord]:
        return [
            TensorRecord(name, kind, str(copy.dtype), tuple(copy.shape), summarise(copy), trainable)
            for name, kind, trainable, copy in self._tensors
        ]

    def release(self) -> None:
        self._tensors = []


class KerasSnapshots:
    """The adapter: Keras layers and models, of either Keras the script imported."""

    def claims(self, model: Any) -> bool:
        classes = _layer_classes()
        return bool(classes) and isinstance(model, classes)

    def unwrap(self, model: Any) -> Any:
        return model

    def capture(self, model: Any, raw: bool) -> KerasCapture:
        return KerasCapture(model, raw)

    def prepare(self, model: Any, raw: bool) -> None:
        """With ``raw``, import the file writer now, not at a boundary (an import holds the GIL)."""
        if raw:
            try:
                import safetensors.numpy  # noqa: F401
            except ImportError:
                pass  # reported when a file is written


ADAPTER = KerasSnapshots()
