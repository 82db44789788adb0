"""One step boundary for every owner of steps: on a data-bound loop in each framework,
consecutive steps never overlap, every fetch sits in one step (or pass, or epoch), and the
steps add up to no more than the loop's wall time (``timeline.check``)."""

from __future__ import annotations

import logging
import os
import time
import warnings

import pytest

import cirron as ci
from timeline import check, fetches_in, steps_of, timed
from trees import kids, named

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

DELAY = 0.003  # seconds a sample takes to load


class SlowData(torch.utils.data.Dataset):
    """Samples of 4 features and one target that take ``DELAY`` seconds each to load."""

    def __init__(self, samples: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, 4, generator=generator)
        self.y = torch.randn(samples, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        time.sleep(DELAY)
        return self.x[index], self.y[index]


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def finished() -> dict:
    ci.shutdown()
    return ci.trace(format="dict")


def test_ci_batches_over_a_slow_loader():
    ci.profile(output="none")
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(SlowData(16), batch_size=4)
    with timed() as wall:
        for _epoch in ci.epochs(range(2)):
            for x, y in ci.batches(loader):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()

    root = finished()
    check(root, wall_ns=wall[0])
    batches = steps_of(root)
    assert len(batches) == 8
    assert all(b["attributes"]["data_load_ns"] >= 4 * DELAY * 1e9 for b in batches)


def test_lightning_fabric_loop():
    fabric_module = pytest.importorskip("lightning.fabric")
    ci.profile(output="none")
    fabric = fabric_module.Fabric(accelerator="cpu", devices=1)
    model, optimizer = fabric.setup(net(), torch.optim.SGD(net().parameters(), lr=0.1))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(SlowData(16), batch_size=4))
    with timed() as wall:
        for _epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                fabric.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()

    root = finished()
    check(root, wall_ns=wall[0])
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [4, 4]
    assert all(fetches_in(s) == 1 for s in steps_of(root))
    for forward in named(root, "forward"):  # the user's model, not Fabric's wrapper
        assert forward["attributes"]["module"] == "Sequential"
        assert forward["attributes"]["wrapper"] == "_FabricModule"


def test_lightning_trainer():
    lightning = pytest.importorskip("lightning")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Regression(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    ci.profile(output="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = lightning.Trainer(
            max_epochs=2, accelerator="cpu", enable_progress_bar=False, logger=False,
            enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
        )  # fmt: skip
    loader = torch.utils.data.DataLoader(SlowData(16), batch_size=4)
    validation = torch.utils.data.DataLoader(SlowData(8, seed=1), batch_size=4)
    with timed() as wall:
        trainer.fit(Regression(), loader, validation)

    root = finished()
    check(root, wall_ns=wall[0])
    assert len(steps_of(root)) == 8
    for epoch in named(root, "epoch"):
        (validate,) = kids(epoch, "validate")
        assert fetches_in(validate) >= 2  # its fetches, none in a step


def test_hf_trainer():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()

    class SlowTokens(torch.utils.data.Dataset):
        def __init__(self, samples: int) -> None:
            generator = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, 50, (samples, 8), generator=generator)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, index: int):
            time.sleep(DELAY)
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    arguments = transformers.TrainingArguments(
        output_dir="out", num_train_epochs=2, per_device_train_batch_size=4,
        per_device_eval_batch_size=4, eval_strategy="epoch", logging_strategy="epoch",
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        gradient_accumulation_steps=2, dataloader_num_workers=0,
    )  # fmt: skip
    ci.profile(output="none")
    trainer = transformers.Trainer(
        model=model, args=arguments, train_dataset=SlowTokens(16), eval_dataset=SlowTokens(8)
    )
    with timed() as wall:
        trainer.train()

    root = finished()
    check(root, wall_ns=wall[0])
    steps = steps_of(root)
    assert len(steps) == 4  # 4 batches an epoch, 2 per optimizer step
    # every fetch of the epoch's 4 batches, and the one that found the loader dry (the
    # prepared loader fetches one ahead, inside the Trainer's fetch for the step)
    assert [fetches_in(s) for s in steps] == [3, 2, 3, 2]
    (train,) = named(root, "train")
    assert train["attributes"]["num_train_epochs"] == 2.0


def test_trainloop():
    trainloop = pytest.importorskip("trainloop")

    class Regression(trainloop.BaseTrainer):
        def build_data_loader(self):
            loader = torch.utils.data.DataLoader(SlowData(16), batch_size=4)

            def forever():
                while True:
                    yield from loader

            return forever()

        def build_model(self):
            return net()

        def build_optimizer(self):
            return torch.optim.SGD(self.model.parameters(), lr=0.05)

        def forward(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x), y), {}

    ci.profile(output="none")
    trainer = Regression(max_steps=6, gradient_accumulation_steps=2, workspace=os.getcwd())
    with timed() as wall:
        trainer.train()

    root = finished()
    check(root, wall_ns=wall[0])
    steps = steps_of(root)
    assert len(steps) == 6
    # two batches a step; the loader runs dry every 4 batches, inside the step that
    # fetches on from its next pass
    assert [fetches_in(s) for s in steps] == [2, 2, 3, 2, 3, 2]


def test_keras_fit():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keras = pytest.importorskip("keras")
    np = pytest.importorskip("numpy")

    class SlowBatches(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int):
            time.sleep(4 * DELAY)
            generator = np.random.default_rng(index)
            return generator.random((4, 4), "float32"), generator.random((4, 1), "float32")

    ci.profile(output="none")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with timed() as wall:
        model.fit(SlowBatches(), epochs=2, validation_data=SlowBatches(), verbose=0)

    root = finished()
    check(root, wall_ns=wall[0], optimizer=False)
    assert [len(kids(e, "batch")) for e in named(root, "epoch")] == [4, 4]
