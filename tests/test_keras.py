"""The Keras instrumentor on real Keras training: small models built here, data in memory.

Each test is a user's script: ``ci.profile(...)``, a model, ``model.fit`` /
``evaluate`` / ``predict``; then the spans read back with
``ci.trace(format="dict")`` and compared with what Keras itself reports
(``History``, the values ``evaluate`` returns). Keras 3 on TensorFlow here;
the torch backend and plain OpenTelemetry run in fresh interpreters, Keras 2
(``tf_keras``) where it is installed.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import cirron as ci  # noqa: E402
from support import run_python  # noqa: E402
from trees import kids, named  # noqa: E402

keras = pytest.importorskip("keras")
np = pytest.importorskip("numpy")

import cirron.training  # noqa: E402

if keras.backend.backend() != "tensorflow":  # pragma: no cover - the suite runs on TF
    pytest.skip("these tests run Keras on TensorFlow", allow_module_level=True)


# -- small models, in-memory data ---------------------------------------------------------------
def data(samples: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    x = generator.normal(size=(samples, 6)).astype("float32")
    y = (x[:, :1] * 0.5 - x[:, 1:2]).astype("float32")
    return x, y


def mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


class Recorder(keras.callbacks.Callback):
    """A user's callback: what Keras called it with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(f"epoch_end {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(f"batch_end {batch}")


def root() -> dict:
    return ci.trace(format="dict")


# -- 1. fit: epochs, batches, validation, marks -------------------------------------------------
def test_fit_gives_its_epochs_batches_and_validation_as_keras_counts_them():
    ci.profile(output="none")
    x, y = data(64)
    user = Recorder()
    history = mlp().fit(
        x, y, epochs=2, batch_size=16, validation_data=data(24, 1), callbacks=[user], verbose=0
    )
    (train,) = named(root(), "train")
    assert train["attributes"]["epochs"] == 2 and train["attributes"]["steps"] == 4
    epochs = kids(train, "epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    for epoch in epochs:
        assert [b["index"] for b in kids(epoch, "batch")] == [0, 1, 2, 3]
        (validate,) = kids(epoch, "validate")
        assert validate["index"] == epoch["index"]
        assert validate["attributes"]["batches"] == 2  # 24 samples in batches of 16
        assert named(validate, "batch") == []  # batch spans are training batches only
    # the user's callback still ran, every time
    assert user.calls.count("epoch_end 0") == 1 and user.calls.count("epoch_end 1") == 1
    assert sum(call.startswith("batch_end") for call in user.calls) == 8
    assert history.history["loss"][1] < history.history["loss"][0] * 10


def test_epoch_logs_are_summary_marks_equal_to_history_and_batch_logs_point_marks():
    ci.profile(output="none")
    x, y = data(48)
    history = mlp().fit(x, y, epochs=3, batch_size=16, validation_data=data(16, 1), verbose=0)
    epochs = named(root(), "epoch")
    assert set(history.history) == {"loss", "mae", "val_loss", "val_mae"}
    for epoch in epochs:
        summary = {m["name"]: m["value"] for m in epoch["marks"] if m["kind"] == "summary"}
        assert summary == {name: values[epoch["index"]] for name, values in history.history.items()}
        last_batch = kids(epoch, "batch")[-1]
        points = {m["name"] for m in last_batch["marks"] if m["kind"] == "point"}
        assert points == {"loss", "mae"}
        (validate,) = kids(epoch, "validate")
        on_validate = {m["name"]: m["value"] for m in validate["marks"]}
        assert on_validate == {
            "loss": history.history["val_loss"][epoch["index"]],
            "mae": history.history["val_mae"][epoch["index"]],
        }


def test_a_users_callback_list_gets_ours_once_and_the_users_list_is_left_as_it_was():
    ci.profile(output="none")
    model, (x, y) = mlp(), data(32)
    user = Recorder()
    given = [user]
    model.fit(x, y, epochs=1, batch_size=16, callbacks=given, verbose=0)
    assert given == [user]
    callbacks = keras.callbacks.CallbackList([Recorder()], add_history=True, model=model)
    model.fit(x, y, epochs=1, batch_size=16, callbacks=callbacks, verbose=0)
    model.fit(x, y, epochs=1, batch_size=16, callbacks=callbacks, verbose=0)
    ours = [c for c in callbacks.callbacks if type(c).__module__ == "cirron.instrumentors.keras"]
    assert len(ours) == 1
    assert len(named(root(), "train")) == 3 and len(named(root(), "batch")) == 6
    model.fit(x, y, epochs=1, batch_size=16, callbacks=user, verbose=0)  # one, not in a list
    assert len(named(root(), "train")) == 4


def test_initial_epoch_and_early_stopping_are_counted_as_keras_counts_them():
    ci.profile(output="none")
    model, (x, y) = mlp(), data(32)
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=1e9)
    model.fit(x, y, initial_epoch=2, epochs=6, batch_size=16, callbacks=[stop], verbose=0)
    first, second = named(root(), "train")
    assert [e["index"] for e in kids(first, "epoch")] == [0, 1]
    assert [e["index"] for e in kids(second, "epoch")] == [2, 3]  # stopped after two


# -- 2. evaluate and predict on their own -----------------------------------------------------
def test_evaluate_and_predict_on_their_own_are_spans_with_their_batches_and_metrics():
    ci.profile(output="none")
    model, (x, y) = mlp(), data(40)
    results = model.evaluate(x, y, batch_size=16, return_dict=True, verbose=0)
    model.predict(x, batch_size=8, verbose=0)
    (evaluate,) = named(root(), "evaluate")
    assert evaluate["attributes"]["batches"] == 3
    assert {m["name"]: m["value"] for m in evaluate["marks"]} == results
    assert all(m["kind"] == "summary" for m in evaluate["marks"])
    (predict,) = named(root(), "predict")
    assert predict["attributes"]["batches"] == 5
    assert named(root(), "epoch") == named(root(), "batch") == named(root(), "validate") == []


def test_evaluate_called_by_a_users_callback_during_fit_is_validation_in_its_epoch():
    ci.profile(output="none")
    x, y = data(32)

    class EvaluateEachEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.evaluate(x, y, batch_size=32, verbose=0)

    mlp().fit(x, y, epochs=2, batch_size=16, callbacks=[EvaluateEachEpoch()], verbose=0)
    for epoch in named(root(), "epoch"):
        (validate,) = kids(epoch, "validate")
        assert validate["index"] == epoch["index"] and validate["attributes"]["batches"] == 1
    assert named(root(), "evaluate") == []


# -- 3. other loops around and inside fit --------------------------------------------------------
class CustomStep(keras.Model):
    """A subclassed model with its own train_step (Keras 3 on TensorFlow)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1)
        self.tracked = keras.metrics.Mean(name="loss")

    def call(self, inputs):
        return self.out(self.hidden(inputs))

    def train_step(self, data):
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(x, training=True) - y))
        variables = self.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        self.tracked.update_state(loss)
        return {"loss": self.tracked.result()}


def test_a_custom_train_step_still_gives_one_epoch_level():
    ci.profile(output="none")
    keras.utils.set_random_seed(0)
    model = CustomStep()
    model.compile(optimizer="sgd")
    x, y = data(32)
    history = model.fit(x, y, epochs=2, batch_size=8, verbose=0)
    epochs = named(root(), "epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    assert all(len(kids(e, "batch")) == 4 for e in epochs)
    assert [next(m["value"] for m in e["marks"] if m["name"] == "loss") for e in epochs] == (
        history.history["loss"]
    )
    assert all(named(e, "epoch") == [e] for e in epochs)  # no epoch inside an epoch


def test_fit_inside_ci_epochs_gives_one_epoch_level_the_users():
    ci.profile(output="none")
    model, (x, y) = mlp(), data(32)
    for _ in ci.epochs(range(2)):
        model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    epochs = named(root(), "epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    for epoch in epochs:
        (train,) = kids(epoch, "train")
        assert len(kids(train, "batch")) == 2 and named(train, "epoch") == []
        assert {m["name"] for m in epoch["marks"]} == {"loss", "mae"}  # the epoch's logs


def test_a_distribution_strategy_with_one_device_still_traces():
    import tensorflow as tf

    ci.profile(output="none")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = mlp()
    x, y = data(32)
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    epochs = named(root(), "epoch")
    assert [len(kids(e, "batch")) for e in epochs] == [2, 2]


# -- 4. snapshots ---------------------------------------------------------------------------------
class TwoKernels(keras.layers.Layer):
    """A layer with two variables of one name: their paths are the same."""

    def build(self, input_shape):
        self.first = self.add_weight(shape=(input_shape[-1], 2), name="kernel")
        self.second = self.add_weight(shape=(input_shape[-1], 2), name="kernel")

    def call(self, inputs):
        return keras.ops.matmul(inputs, self.first) + keras.ops.matmul(inputs, self.second)


def test_one_snapshot_per_epoch_each_variable_once_under_its_path(tmp_path):
    ci.profile(output="none")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), TwoKernels(), keras.layers.BatchNormalization(), keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    x, y = data(32)
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    ci.flush()
    epochs = named(root(), "epoch")
    snapshots = [kids(e, "snapshot") for e in epochs]
    assert [len(s) for s in snapshots] == [1, 1]
    snapshot = snapshots[1][0]
    names = [event["name"] for event in snapshot["events"]]
    assert len(names) == len(set(names)) == len(model.weights) == 8
    paths = [v.path for v in model.weights]
    assert paths.count(paths[0]) == 2  # the two kernels share a path ...
    assert {paths[0], paths[0] + "_1"} <= set(names)  # ... and get a name each
    trainable = {e["name"]: e["attributes"]["trainable"] for e in snapshot["events"]}
    norm, dense = model.layers[1], model.layers[2]
    assert trainable[norm.moving_mean.path] is False and trainable[norm.gamma.path] is True
    assert all(e["attributes"]["kind"] == "weight" for e in snapshot["events"])
    kernel = next(e for e in snapshot["events"] if e["name"] == dense.kernel.path)
    values = dense.kernel.numpy()
    assert kernel["attributes"]["shape"] == [2, 1]
    assert kernel["attributes"]["mean"] == pytest.approx(float(values.mean()), rel=1e-5)
    assert snapshot["attributes"]["snapshot.model"] == "Sequential"
    assert snapshot["attributes"]["snapshot.tensors"] == 8


def test_full_snapshots_write_safetensors_under_the_variable_names(tmp_path):
    from safetensors.numpy import load_file

    ci.profile(output="none", snapshots="full", path=str(tmp_path / "run"))
    model, (x, y) = mlp(), data(32)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    ci.flush()
    (snapshot,) = named(root(), "snapshot")
    saved = load_file(snapshot["attributes"]["snapshot.weights_path"])
    assert set(saved) == {v.path for v in model.weights}
    kernel = model.layers[-1].kernel
    np.testing.assert_array_equal(saved[kernel.path], kernel.numpy())
    assert "snapshot.gradients_path" not in snapshot["attributes"]  # none on TensorFlow


def test_ci_watch_takes_a_keras_model_for_a_custom_loop():
    ci.profile(output="none")
    model, (x, y) = mlp(), data(16)
    ci.watch(model, name="mine")
    for _ in ci.epochs(range(2)):
        model.train_on_batch(x, y)
    ci.flush()
    snapshots = named(root(), "snapshot")
    assert len(snapshots) == 2
    assert snapshots[0]["attributes"]["snapshot.model"] == "mine"


# -- 5. never in the way --------------------------------------------------------------------------
def fit_and_weights(seed: int) -> tuple[dict, list[np.ndarray]]:
    model, (x, y) = mlp(seed), data(48)
    history = model.fit(x, y, epochs=2, batch_size=16, validation_data=data(16, 1), verbose=0)
    return history.history, [w.numpy() for w in model.weights]


def test_results_are_identical_to_an_unprofiled_run_with_the_same_seed():
    plain_history, plain_weights = fit_and_weights(3)
    ci.profile(output="none", snapshots="full")
    traced_history, traced_weights = fit_and_weights(3)
    assert traced_history == plain_history
    for plain, traced in zip(plain_weights, traced_weights, strict=True):
        np.testing.assert_array_equal(plain, traced)
    assert len(named(root(), "epoch")) == 2


def test_a_hook_that_raises_does_not_stop_fit(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken hook")

    monkeypatch.setattr(cirron.training, "begin_step", broken)  # what every batch calls
    ci.profile(output="none")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        history, _ = fit_and_weights(0)
    assert len(history["loss"]) == 2
    assert ci.health()["hook_errors"] == 6  # 3 batches x 2 epochs, each counted
    warnings = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert len(warnings) == 1 and "deliberately broken hook" in warnings[0]
    assert len(named(root(), "epoch")) == 2


def test_an_error_in_fit_reaches_the_user_and_ends_the_spans_with_it():
    class Explodes(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise ValueError("user's callback failed")

    ci.profile(output="none")
    model, (x, y) = mlp(), data(48)
    with pytest.raises(ValueError, match="user's callback failed"):
        model.fit(x, y, epochs=2, batch_size=16, callbacks=[Explodes()], verbose=0)
    (train,) = named(root(), "train")
    (epoch,) = kids(train, "epoch")
    for node in (train, epoch, kids(epoch, "batch")[-1]):
        assert node["end_ns"] is not None and node["status"] == "ERROR"
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)  # the next fit is traced as usual
    assert len(named(root(), "train")) == 2


def test_frameworks_torch_only_leaves_keras_alone():
    fit = keras.Model.fit
    ci.profile(output="none", frameworks=["torch"])
    assert keras.Model.fit is fit
    model, (x, y) = mlp(), data(16)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    assert named(root(), "train") == named(root(), "epoch") == []


def batch_loop(model: keras.Model, epochs) -> None:
    """A user's loop: 4 ``train_on_batch`` per epoch, a mark of each loss, then 2
    ``test_on_batch`` on held-out data."""
    x, y = data(64)
    x_val, y_val = data(32, seed=1)
    for _epoch in epochs:
        for start in range(0, 64, 16):
            logs = model.train_on_batch(
                x[start : start + 16], y[start : start + 16], return_dict=True
            )
            ci.mark("loss", logs["loss"])
        for start in range(0, 32, 16):
            model.test_on_batch(x_val[start : start + 16], y_val[start : start + 16])


def test_a_loop_over_train_on_batch_gives_a_step_each_and_test_on_batch_a_pass():
    ci.profile(output="none")
    model = mlp()
    batch_loop(model, range(2))
    ci.shutdown()
    tree = root()
    (epoch,) = named(tree, "epoch")  # Keras cannot see the user's epochs: a fallback one
    steps = kids(epoch, "step")
    assert len(steps) == 8 and len(named(tree, "step")) == 8
    assert all([m["name"] for m in step["marks"]] == ["loss"] for step in steps)
    passes = kids(epoch, "validate")
    assert [p["attributes"]["batches"] for p in passes] == [2, 2]
    assert [c["name"] for c in epoch["children"] if c["name"] in ("step", "validate")] == (
        ["step"] * 4 + ["validate"] + ["step"] * 4 + ["validate"]
    )
    assert named(tree, "train") == [] and named(tree, "evaluate") == []


def test_a_train_on_batch_loop_inside_ci_epochs_has_its_steps_in_the_users_epochs():
    ci.profile(output="none")
    model = mlp()
    batch_loop(model, ci.epochs(range(2)))
    ci.shutdown()
    epochs = named(root(), "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    assert [kids(e, "validate")[0]["attributes"]["batches"] for e in epochs] == [2, 2]


def test_shutdown_restores_keras_exactly():
    owners = {
        name: next(k for k in keras.Model.__mro__ if name in k.__dict__)
        for name in ("fit", "evaluate", "predict")
    }
    before = {name: owner.__dict__[name] for name, owner in owners.items()}
    ci.profile(output="none")
    assert all(owners[n].__dict__[n] is not before[n] for n in before)
    ci.shutdown()
    assert {name: owner.__dict__[name] for name, owner in owners.items()} == before


# -- 6. in fresh interpreters: the torch backend, plain OpenTelemetry, Keras 2 -----------------------
TORCH_BACKEND = """
    import json, os
    os.environ["KERAS_BACKEND"] = "torch"
    import cirron as ci
    ci.profile(output="none")
    import keras, numpy as np, torch
    torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.rand(32, 6).astype("float32"); y = np.random.rand(32, 1).astype("float32")
    model.fit(x, y, epochs=2, batch_size=16, validation_data=(x[:16], y[:16]), verbose=0)
    model.evaluate(x, y, batch_size=16, verbose=0)
    ci.flush()
    tree = ci.trace(format="dict")
    nodes = []
    def walk(node, parent):
        nodes.append((node["name"], parent, node["index"]))
        for child in node["children"]:
            walk(child, node["name"])
    walk(tree, None)
    snapshot = ci.trace(format="dict", name="snapshot")[-1]
    print("RESULT " + json.dumps({
        "backend": keras.backend.backend(), "nodes": nodes, "hooks": ci.health()["hooks"],
        "errors": ci.health()["hook_errors"],
        "kinds": sorted({(e["name"], e["attributes"]["kind"]) for e in snapshot["events"]}),
    }))
"""


@pytest.mark.slow
def test_on_the_torch_backend_keras_owns_epochs_and_batches_and_torch_spans_sit_inside(tmp_path):
    result = run_python(TORCH_BACKEND, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    assert found["backend"] == "torch" and found["errors"] == 0
    assert set(found["hooks"]) == {"tensorflow", "torch"}
    nodes = [tuple(n) for n in found["nodes"]]
    names = [n[0] for n in nodes]
    assert names.count("epoch") == 2 and names.count("batch") == 4
    assert "step" not in names  # the torch hooks yield the steps to Keras
    parents = {(name, parent) for name, parent, _ in nodes}
    assert {("epoch", "train"), ("batch", "epoch"), ("validate", "epoch")} <= parents
    assert {("forward", "batch"), ("backward", "batch"), ("forward", "validate")} <= parents
    assert ("forward", "evaluate") in parents
    kinds = {tuple(k) for k in found["kinds"]}
    assert ("sequential/dense/kernel", "gradient") in kinds  # left on the tensors by Keras
    assert ("sequential/dense/kernel", "weight") in kinds


STANDALONE = """
    import json, os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    from collections import Counter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from cirron.instrumentors.keras import KerasInstrumentor

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    KerasInstrumentor().instrument(tracer_provider=provider)

    import numpy as np
    import {module} as keras
    model = keras.Sequential([keras.layers.Dense(4, input_shape=(3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.rand(16, 3).astype("float32"); y = np.random.rand(16, 1).astype("float32")
    model.fit(x, y, epochs=2, batch_size=8, validation_data=(x, y), verbose=0)
    KerasInstrumentor().uninstrument()
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # not traced any more

    spans = exporter.get_finished_spans()
    names = {{s.context.span_id: s.name for s in spans}}
    snapshot = [s for s in spans if s.name == "snapshot"][-1]
    print("RESULT " + json.dumps({{
        "counts": Counter(s.name for s in spans),
        "parents": sorted({{(s.name, names.get(s.parent.span_id) if s.parent else None)
                           for s in spans}}, key=str),
        "tensors": sorted(e.name for e in snapshot.events),
    }}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_with_plain_opentelemetry_and_uninstrument(tmp_path, module):
    if module == "tf_keras":
        pytest.importorskip("tf_keras")
    result = run_python(STANDALONE.format(module=module), cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    counts = found["counts"]
    assert (counts["train"], counts["epoch"], counts["batch"], counts["validate"]) == (1, 2, 4, 2)
    assert counts["snapshot"] == 2 and "cirron.session" not in counts
    parents = {tuple(pair) for pair in found["parents"]}
    assert {("train", None), ("epoch", "train"), ("batch", "epoch"), ("validate", "epoch")} <= (
        parents
    )
    if module == "tf_keras":  # Keras 2 names: the variable's name without ":0"
        assert found["tensors"] == ["dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"]
    else:
        assert "sequential/dense/kernel" in found["tensors"]
    assert len(found["tensors"]) == 4


TF_KERAS = """
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import cirron as ci
    ci.profile(output="none")          # before TensorFlow is imported
    import numpy as np
    import tensorflow as tf
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"), epochs=2, batch_size=4,
              verbose=0)
    print("RESULT", len(ci.trace(format="dict", name="epoch")),
          len(ci.trace(format="dict", name="batch")), ",".join(ci.health()["hooks"]))
"""


@pytest.mark.slow
def test_profile_before_tensorflow_is_imported_traces_tf_keras(tmp_path):
    result = run_python(TF_KERAS, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert line.split()[1:] == ["2", "4", "tensorflow"]
