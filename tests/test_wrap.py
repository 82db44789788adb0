"""``ci.wrap(estimator)``: scikit-learn estimators (and any with their shape) stay what they are."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest

import cirron as ci
from cirron.wrap import unwrap
from trees import kids

np = pytest.importorskip("numpy")
sklearn = pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402


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


def data(samples: int = 60):
    x = np.random.default_rng(0).normal(size=(samples, 4))
    return x, (x[:, 0] + 0.3 * x[:, 1] > 0).astype(int)


def spans(name: str) -> list[dict]:
    return ci.trace(format="dict", name=name)


# -- any estimator -------------------------------------------------------------------------------
def test_fit_and_predict_become_spans_and_the_estimator_stays_itself():
    model = TinyRegressor()
    assert ci.wrap(model) is model
    predictions = model.fit([1, 2], [3.0, 5.0]).predict([0, 0, 0])
    assert predictions == [4.0, 4.0, 4.0]
    assert model.mean_ == 4.0 and model.describe() == "mean model"
    assert isinstance(model, TinyRegressor) and type(model).__name__ == "TinyRegressor"
    (fit,) = spans("fit")
    (predict,) = spans("predict")
    assert fit["attributes"] == predict["attributes"] == {"estimator": "TinyRegressor"}
    assert type(unwrap(model)) is TinyRegressor
    model.predict([0])
    assert len(spans("predict")) == 1  # unwrapped: no more spans


def test_errors_in_fit_propagate_and_mark_the_span():
    class Broken(TinyRegressor):
        def fit(self, xs, ys):
            raise ValueError("bad shapes")

    with pytest.raises(ValueError, match="bad shapes"):
        ci.wrap(Broken()).fit([], [])
    assert spans("fit")[0]["status"] == "ERROR"


@pytest.mark.parametrize("thing", [42, None, "fit", LogisticRegression])
def test_wrapping_a_non_estimator_is_a_type_error_naming_the_argument(thing):
    with pytest.raises(TypeError, match="estimator"):
        ci.wrap(thing)


# -- scikit-learn ------------------------------------------------------------------------------
def test_a_wrapped_estimator_is_still_a_scikit_learn_estimator():
    model = ci.wrap(LogisticRegression(C=0.5))
    assert isinstance(model, LogisticRegression)
    assert repr(model) == "LogisticRegression(C=0.5)"
    assert model.get_params() == LogisticRegression(C=0.5).get_params()
    model.set_params(C=2.0)
    x, y = data()
    plain = LogisticRegression(C=2.0).fit(x, y)
    assert model.fit(x, y) is model
    np.testing.assert_array_equal(model.coef_, plain.coef_)  # results identical to unprofiled
    assert model.score(x, y) == plain.score(x, y)
    (score,) = spans("score")
    assert score["children"] == []  # score's own call of predict is part of it
    assert [s["attributes"]["estimator"] for s in spans("fit")] == ["LogisticRegression"]


def test_pickle_gives_the_plain_estimator_and_copies_stay_traced():
    x, y = data()
    model = ci.wrap(LogisticRegression()).fit(x, y)
    loaded = pickle.loads(pickle.dumps(model))
    assert type(loaded) is LogisticRegression  # loads where cirron is not installed
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    for duplicate in (copy.copy(model), copy.deepcopy(model)):
        assert type(duplicate) is type(model)
        duplicate.predict(x)
    assert len(spans("predict")) == 3  # model's and the two copies', not the unpickled one's


def test_clones_stay_traced_so_cross_validation_and_search_fits_are_spans():
    x, y = data()
    model = ci.wrap(LogisticRegression())
    assert type(clone(model)) is type(model)
    scores = cross_val_score(model, x, y, cv=3)
    np.testing.assert_array_equal(scores, cross_val_score(LogisticRegression(), x, y, cv=3))
    assert len(spans("fit")) == 3 and len(spans("score")) == 3
    ci.shutdown()
    ci.shutdown()
    search = GridSearchCV(ci.wrap(LogisticRegression()), {"C": [0.1, 1.0]}, cv=2).fit(x, y)
    assert len(spans("fit")) == 2 * 2 + 1  # two folds per candidate, then the refit
    assert isinstance(search.best_estimator_, LogisticRegression)


def test_a_pipelines_steps_nest_under_its_fit():
    x, y = data()
    pipeline = ci.wrap(make_pipeline(StandardScaler(), LogisticRegression()))
    pipeline.fit(x, y)
    pipeline.predict(x)
    fit = next(s for s in spans("fit") if s["attributes"]["estimator"] == "Pipeline")
    assert [c["attributes"]["estimator"] for c in kids(fit, "fit_transform")] == ["StandardScaler"]
    assert [c["attributes"]["estimator"] for c in kids(fit, "fit")] == ["LogisticRegression"]
    (predict,) = (s for s in spans("predict") if s["attributes"]["estimator"] == "Pipeline")
    assert [c["name"] for c in predict["children"]] == ["transform", "predict"]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", [LogisticRegression(), StandardScaler()])
def test_scikit_learns_estimator_checks_pass_on_a_wrapped_estimator(estimator):
    from sklearn.utils.estimator_checks import check_estimator

    ci.profile(output="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(ci.wrap(estimator), on_fail=None)
    failed = [(r["check_name"], r["exception"]) for r in results if r["status"] == "failed"]
    assert failed == []
    assert ci.health()["hook_errors"] == 0
