"""Validation of what users pass as mark values and span attributes.

OpenTelemetry attributes hold str, bool, int (64-bit), float and homogeneous
sequences of those. Users also hand us 0-d numpy arrays, numpy scalars and
0-d torch tensors; those are unwrapped with ``.item()`` (duck-typed, so the
core never imports numpy or torch). Anything else is a ``TypeError`` that
names what was wrong.

A mark's value (:func:`mark_value`) may also be any one-element tensor or
array (``loss.view(1)``, a metric's ``[1]``-shaped result). One that is still
on a device (CUDA) is not read at the mark, which would wait for the device:
the framework's hooks register a :data:`device_reader` that copies it to the
host without waiting, and the value is filled in on the flush thread once the
copy has landed (a :class:`Deferred`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_VALUE_LENGTH = 8192  # characters kept of a string value; the rest is cut
_SCALARS = (str, bool, int, float)


def scalar(value: Any, what: str) -> str | bool | int | float:
    """``value`` as an OTel scalar; ``what`` names it in the error message."""
    kind = type(value)
    if kind is float or kind is str or kind is bool:
        return value  # type: ignore[no-any-return]
    if kind is int:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"{what} is out of the 64-bit integer range: {value}")
        return value  # type: ignore[no-any-return]
    if isinstance(value, _SCALARS):  # subclasses: IntEnum, numpy.float64, ...
        for base in (bool, int, float, str):
            if isinstance(value, base):
                return scalar(base(value), what)
    if getattr(value, "item", None) is not None and getattr(value, "ndim", None) == 0:
        return scalar(_item(value, what), what)
    raise TypeError(
        f"{what} must be an int, float, bool, str or a 0-d numpy/torch value, "
        f"got {type(value).__name__}"
    )


class Deferred:
    """A mark value that is read later, off the training thread: ``resolve(final)`` returns
    it, or None while the device has not got there (``final``: wait for it)."""

    __slots__ = ("resolve",)

    def __init__(self, resolve: Any) -> None:
        self.resolve = resolve


# Set by an instrumentor that knows device tensors (torch): ``reader(value)`` returns the
# ``resolve`` of a Deferred for a one-element tensor on a device, or None to read it now.
device_reader: list[Any] = [None]


def mark_value(value: Any, what: str) -> str | bool | int | float | Deferred:
    """A mark's value: :func:`scalar`, or the one element of a tensor or array.

    A ``TypeError``/``ValueError`` that names ``what`` when it is neither.
    """
    item = getattr(value, "item", None)
    if item is None or isinstance(value, _SCALARS) or getattr(value, "ndim", None) == 0:
        if getattr(value, "ndim", None) == 0 and _on_device(value):
            return _deferred(value, what)
        try:
            return scalar(value, what)
        except TypeError:
            raise TypeError(
                f"{what} must be a number, a bool, a str, or a one-element tensor or array, "
                f"got {type(value).__name__}"
            ) from None
    numel = getattr(value, "numel", None)
    count = numel() if callable(numel) else getattr(value, "size", None)
    if count != 1:
        raise TypeError(f"{what} must be a single number, got {type(value).__name__} of {count}")
    if _on_device(value):
        return _deferred(value, what)
    return scalar(_item(value, what), what)


def _item(value: Any, what: str) -> Any:
    """``value.item()``; a ``TypeError`` naming ``what`` when it can't be read (a meta tensor)."""
    try:
        unwrapped = value.item()
    except Exception as error:  # noqa: BLE001 - whatever the library raised, name the mark
        raise TypeError(f"{what} can't be read: {type(error).__name__}: {error}") from None
    if not isinstance(unwrapped, _SCALARS):
        raise TypeError(f"{what} must be a number, got {type(unwrapped).__name__}")
    return unwrapped


def _on_device(value: Any) -> bool:
    device = getattr(value, "device", None)
    kind = getattr(device, "type", None)
    return kind is not None and kind != "cpu" and device_reader[0] is not None


def _deferred(value: Any, what: str) -> str | bool | int | float | Deferred:
    try:
        resolve = device_reader[0](value)
    except Exception:  # noqa: BLE001 - a reader that fails: read it the plain way
        resolve = None
    if resolve is None:
        return scalar(_item(value, what), what)
    return Deferred(resolve)


def _cut(value: Any) -> Any:
    """A string longer than :data:`MAX_VALUE_LENGTH` cut to it (a hostile 10 MB value)."""
    if type(value) is str and len(value) > MAX_VALUE_LENGTH:
        return value[:MAX_VALUE_LENGTH]
    return value


def attribute(value: Any, what: str) -> Any:
    """An OTel attribute value: a scalar or a homogeneous list/tuple of scalars.

    Strings are cut at :data:`MAX_VALUE_LENGTH` characters, as the SDK's
    attribute limit would cut them.
    """
    if isinstance(value, (list, tuple)):
        items = [_cut(scalar(item, what)) for item in value]
        kinds = {type(item) for item in items}
        if kinds == {int, float}:
            items = [float(item) for item in items]
        elif len(kinds) > 1:
            raise TypeError(
                f"{what} must hold values of one type, got {sorted(k.__name__ for k in kinds)}"
            )
        return tuple(items)
    return _cut(scalar(value, what))


def attributes(values: Mapping[str, Any], what: str) -> dict[str, Any]:
    return {key: attribute(value, f"{what} attribute {key!r}") for key, value in values.items()}


def name(value: Any, argument: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{argument} must be a non-empty string")
    return value


def index(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("index must be an int, got bool")
    converted = scalar(value, "index")  # an int too: its 64-bit range
    if not isinstance(converted, int) or isinstance(converted, bool):
        raise TypeError(f"index must be an int, got {type(value).__name__}")
    return converted
