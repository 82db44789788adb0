from __future__ import annotations

import pytest

import cirron as ci


class TinyRegressor:
    """A user's own estimator with the scikit-learn shape."""

    def __init__(self):
        self.mean_ = None

    def fit(self, xs, ys):
        self.mean_ = sum(ys) / len(ys)
        return self

    def predict(self, xs):
        return [self.mean_ for _ in xs]

    def describe(self):
        return "mean model"


def test_fit_and_predict_become_scopes_and_everything_else_delegates():
    model = ci.wrap(TinyRegressor())
    predictions = model.fit([1, 2], [3.0, 5.0]).predict([0, 0, 0])
    assert predictions == [4.0, 4.0, 4.0]
    assert model.mean_ == 4.0
    assert model.describe() == "mean model"
    (fit,) = ci.trace(format="dict", name="fit")
    (predict,) = ci.trace(format="dict", name="predict")
    assert fit["attributes"] == {"estimator": "TinyRegressor"}
    assert predict["attributes"] == {"estimator": "TinyRegressor"}
    assert isinstance(model.unwrap(), TinyRegressor)


def test_errors_in_fit_propagate_and_mark_the_scope():
    class Broken(TinyRegressor):
        def fit(self, xs, ys):
            raise ValueError("bad shapes")

    with pytest.raises(ValueError, match="bad shapes"):
        ci.wrap(Broken()).fit([], [])
    assert ci.trace(format="dict", name="fit")[0]["status"] == "ERROR"


def test_wrapping_something_without_fit_is_a_type_error():
    with pytest.raises(TypeError, match="estimator"):
        ci.wrap(42)
