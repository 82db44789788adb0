"""``ci.wrap(estimator)``: an estimator whose ``fit``, ``predict``, ... are spans.

For libraries with no hook point (scikit-learn and anything with its shape).
The estimator stays what it is: ``ci.wrap`` gives it a traced subclass of its
own class (same name, same ``__init__``, same parameters), in place, and
returns it. So ``isinstance`` holds, ``get_params``/``set_params`` and
``repr`` are the estimator's, and ``sklearn.base.clone`` (which builds a new
object of the estimator's class: ``cross_val_score``, ``GridSearchCV``)
gives traced clones. Each call of a traced method is a span named after the
method with attribute ``estimator`` = the class name; the steps of a
``Pipeline`` (wrapped with it) nest under its span. An estimator's calls of
its own methods (``score`` calling ``predict``) are part of the outer span.

Pickling gives the plain estimator: a saved model loads where cirron is not
installed, and unpickles untraced (``ci.wrap`` it again to trace it).
``copy.copy`` and ``copy.deepcopy`` keep it traced.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import threading
from typing import Any

from .recording.scopes import scope

TRACED_METHODS = (
    "fit",
    "partial_fit",
    "predict",
    "predict_proba",
    "predict_log_proba",
    "transform",
    "fit_transform",
    "fit_predict",
    "score",
    "decision_function",
    "inverse_transform",
)
_MARK = "__cirron_traced__"  # set on traced classes: the class they trace

_classes: dict[type, type] = {}  # estimator class -> its traced subclass
_classes_lock = threading.Lock()


# The estimators inside a traced call now: their calls of their own methods (``score``
# calling ``predict``) are part of that call, not spans of their own.
_inside: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "cirron_estimators", default=frozenset()
)


def _traced_method(name: str, method: Any) -> Any:
    @functools.wraps(method)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        inside = _inside.get()
        if id(self) in inside:
            return method(self, *args, **kwargs)
        token = _inside.set(inside | {id(self)})
        try:
            with scope(name, estimator=type(self).__name__):
                return method(self, *args, **kwargs)
        finally:
            _inside.reset(token)

    return traced


def _plain(cls: Any, state: Any) -> Any:
    """Unpickle: an object of the plain class ``cls`` with ``state``."""
    obj = cls.__new__(cls)
    if hasattr(obj, "__setstate__"):
        obj.__setstate__(state)
    elif state:
        obj.__dict__.update(state)
    return obj


def _reduce_ex(self: Any, protocol: int) -> Any:
    plain = getattr(type(self), _MARK)
    state = self.__getstate__() if hasattr(self, "__getstate__") else self.__dict__
    return _plain, (plain, state)


def _copy(self: Any) -> Any:
    kind: Any = type(self)
    clone = kind.__new__(kind)
    clone.__dict__.update(self.__dict__)
    return clone


def _deepcopy(self: Any, memo: dict[int, Any]) -> Any:
    kind: Any = type(self)
    clone = kind.__new__(kind)
    memo[id(self)] = clone
    clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return clone


def traced_class(cls: type) -> type:
    """The traced subclass of ``cls`` (one per class, made on first use)."""
    if _MARK in cls.__dict__:
        return cls  # already traced
    with _classes_lock:
        found = _classes.get(cls)
        if found is None:
            found = _classes[cls] = _make_traced_class(cls)
        return found


def _make_traced_class(cls: type) -> type:
    namespace: dict[str, Any] = {
        "__slots__": (),  # the same layout: an instance's class can be swapped
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        _MARK: cls,
        "__reduce_ex__": _reduce_ex,
        "__copy__": _copy,
        "__deepcopy__": _deepcopy,
    }
    traced = type(cls.__name__, (cls,), namespace)
    # What the base's __init_subclass__ set on the new class (scikit-learn's output
    # wrapping, its metadata-request methods) goes: the base's own settings apply.
    for name in set(vars(traced)) - set(namespace):
        delattr(traced, name)
    # Set afterwards, not in the namespace, so no __init_subclass__ wraps them again.
    for name in TRACED_METHODS:
        method = getattr(cls, name, None)
        if callable(method):
            setattr(traced, name, _traced_method(name, method))
    return traced


def is_traced(estimator: Any) -> bool:
    return getattr(type(estimator), _MARK, None) is not None


def wrap(estimator: Any) -> Any:
    """Trace ``estimator.fit(...)``, ``.predict(...)`` and friends as spans; returns ``estimator``.

    The estimator itself becomes traced (its class is swapped for a traced
    subclass); ``unwrap(estimator)`` undoes it.
    """
    if estimator is None or isinstance(estimator, type):
        raise TypeError(
            f"estimator must be an estimator object with fit/predict methods, got {estimator!r}"
        )
    if is_traced(estimator):
        return estimator
    if not any(callable(getattr(estimator, m, None)) for m in TRACED_METHODS):
        raise TypeError(
            f"estimator must have a fit/predict/transform method, got {type(estimator).__name__}"
        )
    if not hasattr(estimator, "__dict__"):
        raise TypeError(
            f"estimator must be an instance of a Python class, got {type(estimator).__name__}"
        )
    try:
        estimator.__class__ = traced_class(type(estimator))
    except TypeError as error:  # a class whose instances can't change class (odd layouts)
        raise TypeError(
            f"estimator of class {type(estimator).__name__} can't be traced: {error}"
        ) from None
    for part in _parts(estimator):  # a Pipeline's steps, a search's estimator
        wrap(part)
    return estimator


def _parts(estimator: Any) -> list[Any]:
    """The estimators inside a meta-estimator, as its ``get_params`` lists them."""
    get_params = getattr(estimator, "get_params", None)
    if not callable(get_params):
        return []
    try:
        values = list(get_params(deep=False).values())
    except Exception:  # noqa: BLE001 - not scikit-learn's get_params after all
        return []
    parts = []
    for value in values:
        if isinstance(value, (list, tuple)):  # Pipeline(steps=[(name, step), ...])
            value = [v[-1] if isinstance(v, tuple) and v else v for v in value]
        for candidate in value if isinstance(value, list) else [value]:
            if (
                not isinstance(candidate, type)
                and hasattr(candidate, "__dict__")
                and callable(getattr(candidate, "fit", None))
                and not is_traced(candidate)
            ):
                parts.append(candidate)
    return parts


def unwrap(estimator: Any) -> Any:
    """``estimator`` untraced again (in place); returns it."""
    plain = getattr(type(estimator), _MARK, None)
    if plain is not None:
        estimator.__class__ = plain
    return estimator
