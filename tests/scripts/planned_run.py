"""A run of known length that pauses part way, for ``cirron watch`` to look at it.

``python planned_run.py FRAMEWORK``: ``transformers`` trains a tiny GPT-2 for
``max_steps=1000`` and pauses after step 300; ``lightning`` and ``keras`` train a linear
model for 5 epochs of 8 steps and pause after the fourth step of the third epoch. At the
pause the spans are flushed, ``PAUSED`` printed, and the run goes on once a file ``go``
appears in the working directory.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import cirron as ci  # noqa: E402

EPOCHS, BATCH, SAMPLES = 5, 4, 32  # 8 steps an epoch


def pause() -> None:
    ci.flush()
    print("PAUSED", flush=True)
    while not os.path.exists("go"):
        time.sleep(0.05)


def transformers_run() -> None:
    import torch
    import transformers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    transformers.logging.set_verbosity_error()

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.ids = torch.randint(0, 50, (64, 8), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class PauseAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 300:
                pause()

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    arguments = TrainingArguments(
        output_dir="out", max_steps=1000, per_device_train_batch_size=4, save_strategy="no",
        logging_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=arguments, train_dataset=Tokens(),
        callbacks=[PauseAt()],
    )  # fmt: skip
    trainer.train()


def lightning_run() -> None:
    import lightning as L
    import torch

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            return torch.nn.functional.mse_loss(self.layer(inputs), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.current_epoch == 2 and batch_idx == 3:
                pause()

    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(SAMPLES, 4, generator=generator), torch.randn(SAMPLES, 1, generator=generator)
    )
    trainer = L.Trainer(
        max_epochs=EPOCHS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=BATCH))


def keras_run() -> None:
    import keras
    import numpy as np

    class PauseAt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 2 and batch == 3:
                pause()

    keras.utils.set_random_seed(0)
    inputs = np.random.default_rng(0).normal(size=(SAMPLES, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(
        inputs, inputs.sum(axis=1, keepdims=True), epochs=EPOCHS, batch_size=BATCH, verbose=0,
        callbacks=[PauseAt()],
    )  # fmt: skip


if __name__ == "__main__":
    ci.profile(flush_interval=0.2)
    {"transformers": transformers_run, "lightning": lightning_run, "keras": keras_run}[
        sys.argv[1]
    ]()
