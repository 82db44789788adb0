"""TensorFlow custom training loops, as TensorFlow's guide "writing a training loop from
scratch" writes them: a ``tf.data.Dataset``, ``tf.GradientTape``, the optimizer's
``apply_gradients``, eager and under ``@tf.function``; the epochs, steps, passes and hook spans
are the ones the loop's code implies, and ``timeline.check`` holds."""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import cirron as ci  # noqa: E402
from timeline import check, fetches_in, steps_of  # noqa: E402
from trees import child_names, kids, named  # noqa: E402

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")
np = pytest.importorskip("numpy")

if keras.backend.backend() != "tensorflow":  # pragma: no cover - the suite runs on TF
    pytest.skip("these tests run Keras on TensorFlow", allow_module_level=True)


def datasets():
    """64 training samples in batches of 16 (4 batches), 32 for validation (2 batches)."""
    generator = np.random.default_rng(0)
    x = generator.normal(size=(96, 6)).astype("float32")
    y = generator.integers(0, 3, size=(96,))
    train = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(16)
    validation = tf.data.Dataset.from_tensor_slices((x[64:], y[64:])).batch(16)
    return train, validation


def setup():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])  # fmt: skip
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, optimizer, loss_fn


@pytest.fixture(autouse=True)
def profiled():
    ci.profile(output="none", frameworks=["tensorflow"])
    yield
    ci.shutdown()


def finished() -> dict:
    ci.shutdown()
    return ci.trace(format="dict")


def test_the_guides_eager_loop_has_an_epoch_per_pass_and_a_step_per_update():
    model, optimizer, loss_fn = setup()
    train, validation = datasets()
    for _epoch in range(2):
        for x, y in train:
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            gradients = tape.gradient(loss, model.trainable_weights)
            optimizer.apply_gradients(zip(gradients, model.trainable_weights, strict=True))
            ci.mark("loss", float(loss))
        for x, _y in validation:
            model(x, training=False)

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    for step in steps_of(root):
        names = child_names(step)
        assert fetches_in(step) == 1
        assert (names["forward"], names["backward"], names["optimizer_step"]) == (1, 1, 1)
        assert kids(step, "forward")[0]["attributes"]["mode"] == "train"
        assert [m["name"] for m in step["marks"]] == ["loss"]
    for epoch in epochs:
        (validate,) = kids(epoch, "validate")
        assert validate["attributes"]["batches"] == 2
        assert fetches_in(validate) == 3 and child_names(validate)["forward"] == 2
    assert named(root, "train") == []


def test_a_teachers_call_before_the_tape_is_inside_the_students_step():
    """Distillation in a custom loop: the teacher's predictions (``training=False``, outside
    the tape), then the student's update on the same batch."""
    teacher, _, _ = setup()
    student, optimizer, loss_fn = setup()
    distill = keras.losses.KLDivergence()
    train, validation = datasets()
    for _epoch in range(2):
        for x, y in train:
            soft = tf.nn.softmax(teacher(x, training=False))
            with tf.GradientTape() as tape:
                logits = student(x, training=True)
                loss = loss_fn(y, logits) + distill(soft, tf.nn.softmax(logits))
            gradients = tape.gradient(loss, student.trainable_weights)
            optimizer.apply_gradients(zip(gradients, student.trainable_weights, strict=True))
        for x, _y in validation:
            student(x, training=False)

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    for step in steps_of(root):
        assert fetches_in(step) == 1
        modes = sorted(f["attributes"]["mode"] for f in kids(step, "forward"))
        assert modes == ["eval", "train"]
    assert [[v["attributes"]["batches"] for v in kids(e, "validate")] for e in epochs] == [[2], [2]]


def test_a_compiled_train_step_is_a_step_per_call_with_its_fetch():
    model, optimizer, loss_fn = setup()
    train, validation = datasets()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_weights)
        optimizer.apply(gradients, model.trainable_weights)
        return loss

    @tf.function
    def test_step(x):
        return model(x, training=False)

    for _epoch in range(2):
        for x, y in train:
            train_step(x, y)
        for x, _y in validation:
            test_step(x)

    root = finished()
    check(root, optimizer=False)  # (a compiled step holds no hook span of its work)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    steps = steps_of(root)
    assert all(fetches_in(step) == 1 for step in steps)
    # The first call traces the function: the hooks see its work once, then it is compiled.
    assert child_names(steps[0])["optimizer_step"] == 1
    assert all("forward" not in child_names(step) for step in steps[1:])
    assert [kids(e, "validate")[0]["attributes"]["batches"] for e in epochs] == [2, 2]


def test_fit_inside_a_custom_loop_script_is_still_kerass_alone():
    model, optimizer, loss_fn = setup()
    train, validation = datasets()
    model.compile(optimizer=optimizer, loss=loss_fn)
    model.fit(train, epochs=2, validation_data=validation, verbose=0)

    root = finished()
    epochs = named(root, "epoch")
    assert [len(kids(e, "batch")) for e in epochs] == [4, 4]
    assert named(root, "step") == [] and named(root, "data_load") == []


def test_a_hook_that_raises_leaves_the_loop_and_its_results_alone(monkeypatch, caplog):
    from cirron.instrumentors import keras_custom_loops

    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken hook")

    monkeypatch.setattr(keras_custom_loops.LOOP, "training_work", broken)
    model, optimizer, loss_fn = setup()
    train, _ = datasets()
    with caplog.at_level(logging.WARNING, logger="cirron"):
        for x, y in train:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            gradients = tape.gradient(loss, model.trainable_weights)
            optimizer.apply_gradients(zip(gradients, model.trainable_weights, strict=True))
    assert int(optimizer.iterations) == 4  # every update made
    assert ci.health()["hook_errors"] >= 4
    warnings = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert len(warnings) == 1 and "deliberately broken hook" in warnings[0]
    finished()  # and the run shuts down cleanly
