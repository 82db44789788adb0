"""A subclassed Keras model on the torch backend, in the shape of Keras's subclassing demo:
layers built in ``__init__``, wired in ``call``, compiled with a metric and fitted on
NumPy arrays with ``validation_split``.

Implied: 2 epochs of 8 batches (256 training samples of 320, batches of 32) owned by Keras,
a validate pass of 2 batches in each; no torch step of its own, no forward outside Keras's
moments counted as training, and no forward for the calls on the meta device that build the
model (4 eval forwards in all: the validate passes' batches).
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402


class MyModel(keras.Model):
    def __init__(self, hidden_dim: int, output_dim: int) -> None:
        super().__init__()
        self.dense1 = layers.Dense(hidden_dim, activation="relu")
        self.dense2 = layers.Dense(hidden_dim, activation="relu")
        self.dense3 = layers.Dense(output_dim)

    def call(self, x):
        return self.dense3(self.dense2(self.dense1(x)))


if __name__ == "__main__":
    keras.utils.set_random_seed(0)
    model = MyModel(hidden_dim=64, output_dim=4)
    rng = np.random.default_rng(0)
    x, y = rng.random((320, 16), "float32"), rng.random((320, 4), "float32")
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.01),
        loss=keras.losses.MeanSquaredError(),
        metrics=[keras.metrics.MeanSquaredError()],
    )
    history = model.fit(x, y, batch_size=32, epochs=2, validation_split=0.2, verbose=0)
    print("history", {k: round(v[-1], 4) for k, v in history.history.items()})
