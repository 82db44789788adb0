"""A small Keras run (an MLP on in-memory data), profiled, that prints its trace.

    pip install -e ".[tensorflow]"
    python examples/train_keras.py [--epochs 3]

``model.fit`` needs nothing from cirron but ``ci.profile()``: its epochs, batches and
validation become spans, what Keras logs becomes marks (the epoch's equal to
``History``), and the model is snapshotted once an epoch, each variable under its path.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import cirron as ci  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    arguments = parser.parse_args()
    ci.profile(output="none")

    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    generator = np.random.default_rng(0)
    x = generator.normal(size=(256, 8)).astype("float32")
    y = (x[:, :1] - 0.5 * x[:, 1:2]).astype("float32")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.fit(x, y, epochs=arguments.epochs, batch_size=64, validation_split=0.25, verbose=0)
    model.evaluate(x, y, batch_size=128, verbose=0)
    print(ci.trace())


if __name__ == "__main__":
    main()
