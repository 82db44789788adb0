"""``ci.wrap(estimator)``: scopes around an estimator's ``fit``, ``predict``, ...

For libraries with no hook point (scikit-learn and anything with the same
shape). The wrapper delegates every attribute to the estimator; calls of the
traced methods run inside a scope named after the method, with attribute
``estimator`` = the class name. ``fit`` returns the wrapper (not the bare
estimator) so ``ci.wrap(m).fit(X, y).predict(X)`` stays traced.
"""

from __future__ import annotations

from typing import Any

from .scopes import scope

TRACED_METHODS = frozenset(
    {
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
    }
)


class Wrapped:
    """A traced view of an estimator; ``.unwrap()`` gives the estimator back."""

    __slots__ = ("_estimator",)

    def __init__(self, estimator: Any) -> None:
        object.__setattr__(self, "_estimator", estimator)

    def unwrap(self) -> Any:
        return self._estimator

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._estimator, name)
        if name not in TRACED_METHODS or not callable(attribute):
            return attribute
        estimator_name = type(self._estimator).__name__

        def traced(*args: Any, **kwargs: Any) -> Any:
            with scope(name, estimator=estimator_name):
                result = attribute(*args, **kwargs)
            return self if result is self._estimator else result

        traced.__name__ = name
        traced.__doc__ = getattr(attribute, "__doc__", None)
        return traced

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._estimator, name, value)

    def __repr__(self) -> str:
        return f"ci.wrap({self._estimator!r})"


def wrap(estimator: Any) -> Any:
    """Trace ``estimator.fit(...)``, ``.predict(...)`` and friends as scopes."""
    if estimator is None:
        raise TypeError("estimator must be an object with fit/predict methods, got None")
    if isinstance(estimator, Wrapped):
        return estimator
    if not any(callable(getattr(estimator, m, None)) for m in TRACED_METHODS):
        raise TypeError(
            f"estimator must have a fit/predict/transform method, got {type(estimator).__name__}"
        )
    return Wrapped(estimator)
