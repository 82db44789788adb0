"""The Lightning instrumentor on real ``Trainer`` runs: a small LightningModule on CPU, data in memory.

Each test is a user's script: ``ci.profile()``, a ``LightningModule``,
``Trainer(...).fit(...)`` (then ``test``, ``predict``, ``validate``); the
spans read back with ``ci.trace(format="dict")`` and compared with what
Lightning itself logged (a ``CSVLogger``'s rows).
"""

from __future__ import annotations

import csv
import logging
import warnings
from pathlib import Path

import pytest

import cirron as ci
from trees import kids, named

torch = pytest.importorskip("torch")
lightning = pytest.importorskip("lightning")

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

import cirron.training  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class Regression(L.LightningModule):
    """A user's module: logs per step and per epoch, validates, tests, predicts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader(samples: int = 32, seed: int = 0) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(
        torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator)
    )
    return torch.utils.data.DataLoader(data, batch_size=8)


def trainer(root: Path, **options) -> L.Trainer:
    settings = dict(
        max_epochs=2,
        log_every_n_steps=1,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        logger=CSVLogger(root, name="csv"),
    )
    settings.update(options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return L.Trainer(**settings)


def logged_rows(run: L.Trainer) -> list[dict[str, str]]:
    path = Path(run.logger.log_dir) / "metrics.csv"
    with path.open() as handle:
        return list(csv.DictReader(handle))


def root() -> dict:
    return ci.trace(format="dict")


def test_fit_gives_epochs_steps_validation_and_the_torch_spans_inside(tmp_path):
    ci.profile(output="none")
    run = trainer(tmp_path, num_sanity_val_steps=2)
    run.fit(Regression(), loader(32), loader(16, 1))
    (train,) = named(root(), "train")
    sanity, *rest = kids(train, "validate")
    assert sanity["attributes"]["sanity_check"] is True and rest == []
    epochs = kids(train, "epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    steps = [s for e in epochs for s in kids(e, "step")]
    assert [s["index"] for s in steps] == list(range(8))  # 4 batches of 8, 2 epochs
    for step in steps:
        assert len(named(step, "forward")) == 1 and len(named(step, "backward")) == 1
        assert len(named(step, "optimizer_step")) == 1
    for epoch in epochs:
        (validate,) = kids(epoch, "validate")
        assert validate["index"] == epoch["index"] and validate["attributes"]["batches"] == 2
        assert named(validate, "step") == [] and named(validate, "batch") == []
        assert {f["attributes"]["mode"] for f in named(validate, "forward")} == {"eval"}
    assert named(root(), "step")[0]["parent_id"] == epochs[0]["span_id"]


def test_logged_values_are_marks_equal_to_what_lightning_logged(tmp_path):
    ci.profile(output="none")
    run = trainer(tmp_path)
    run.fit(Regression(), loader(32), loader(16, 1))
    rows = logged_rows(run)
    step_rows = [r for r in rows if r.get("train_loss_step")]
    steps = named(root(), "step")
    assert len(step_rows) == len(steps) == 8
    for row, step in zip(step_rows, steps, strict=True):
        points = {m["name"]: m["value"] for m in step["marks"] if m["kind"] == "point"}
        assert points["train_loss_step"] == pytest.approx(float(row["train_loss_step"]))
    for epoch in named(root(), "epoch"):
        summary = {m["name"]: m["value"] for m in epoch["marks"] if m["kind"] == "summary"}
        (row,) = [
            r for r in rows if r.get("train_loss_epoch") and int(r["epoch"]) == epoch["index"]
        ]
        assert summary["train_loss_epoch"] == pytest.approx(float(row["train_loss_epoch"]))
        (validation,) = [r for r in rows if r.get("val_loss") and int(r["epoch"]) == epoch["index"]]
        assert summary["val_loss"] == pytest.approx(float(validation["val_loss"]))
        (validate,) = kids(epoch, "validate")
        assert {m["name"] for m in validate["marks"]} == {"val_loss"}


def test_gradient_accumulation_gives_one_step_per_optimizer_step(tmp_path):
    ci.profile(output="none")
    trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(Regression(), loader(32))
    steps = named(root(), "step")
    assert [s["index"] for s in steps] == [0, 1]
    assert [len(named(s, "forward")) for s in steps] == [2, 2]
    assert [len(named(s, "optimizer_step")) for s in steps] == [1, 1]


def test_validation_half_way_through_an_accumulated_step_is_the_epochs_not_the_steps(tmp_path):
    ci.profile(output="none")
    # 6 batches of 8, 2 a step, validation after every 3 batches: the middle of a step
    run = trainer(
        tmp_path, max_epochs=1, accumulate_grad_batches=2, val_check_interval=3,
        num_sanity_val_steps=0,
    )  # fmt: skip
    run.fit(Regression(), loader(48), loader(16, 1))
    (epoch,) = named(root(), "epoch")
    assert [v["index"] for v in kids(epoch, "validate")] == [0, 0]
    assert named(root(), "validate") == kids(epoch, "validate")  # none inside a step
    steps = kids(epoch, "step")
    assert [s["index"] for s in steps] == [0, 1, 2]  # one a step of the optimizer, still
    assert [len(named(s, "forward")) for s in steps] == [2, 2, 2]  # the training forwards
    assert all(not s["attributes"].get("partial") for s in steps)


def test_test_predict_and_validate_on_their_own_are_spans_with_their_batches(tmp_path):
    ci.profile(output="none")
    run = trainer(tmp_path)
    model = Regression()
    (tested,) = run.test(model, loader(24), verbose=False)
    run.predict(model, loader(16))
    (validated,) = run.validate(model, loader(8), verbose=False)
    (test,) = named(root(), "test")
    assert test["attributes"]["batches"] == 3
    assert {m["name"]: m["value"] for m in test["marks"]} == pytest.approx(tested)
    (predict,) = named(root(), "predict")
    assert predict["attributes"]["batches"] == 2
    (evaluate,) = named(root(), "evaluate")
    assert evaluate["attributes"]["batches"] == 1
    assert {m["name"]: m["value"] for m in evaluate["marks"]} == pytest.approx(validated)
    assert named(root(), "epoch") == named(root(), "step") == named(root(), "validate") == []


def test_a_second_fit_snapshots_its_own_module_and_not_the_first_ones(tmp_path):
    ci.profile(output="none")
    trainer(tmp_path / "a", max_epochs=1).fit(Regression(), loader(16))
    watched = Regression()
    ci.watch(watched, name="mine")  # watched by the user: stays watched
    trainer(tmp_path / "b", max_epochs=1).fit(watched, loader(16))
    trainer(tmp_path / "c", max_epochs=1).fit(Regression(), loader(16))
    ci.flush()
    snapshots = [
        sorted(s["attributes"]["snapshot.model"] for s in kids(e, "snapshot"))
        for e in named(root(), "epoch")
    ]
    assert snapshots == [["Regression"], ["mine"], ["Regression", "mine"]]


def test_checkpoints_are_spans_and_the_module_is_snapshotted_each_epoch(tmp_path):
    ci.profile(output="none")
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    trainer(tmp_path, callbacks=[checkpoints]).fit(Regression(), loader(32))
    ci.flush()
    for epoch in named(root(), "epoch"):
        (snapshot,) = kids(epoch, "snapshot")
        kinds = {(e["name"], e["attributes"]["kind"]) for e in snapshot["events"]}
        assert ("net.0.weight", "weight") in kinds and ("net.0.weight", "gradient") in kinds
        assert snapshot["attributes"]["snapshot.model"] == "Regression"
        (checkpoint,) = kids(epoch, "checkpoint")
        assert Path(checkpoint["attributes"]["path"]).is_file()
        assert Path(checkpoint["attributes"]["path"]).parent == tmp_path / "ckpt"


def test_results_are_identical_to_an_unprofiled_run(tmp_path):
    plain = Regression()
    trainer(tmp_path / "a").fit(plain, loader(32), loader(16, 1))
    ci.profile(output="none", snapshots="full", path=str(tmp_path / "run"))
    traced = Regression()
    trainer(tmp_path / "b").fit(traced, loader(32), loader(16, 1))
    assert traced.losses == plain.losses
    for a, b in zip(plain.parameters(), traced.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_error_in_fit_reaches_the_user_and_ends_the_spans_with_it(tmp_path):
    class Broken(Regression):
        def training_step(self, batch, batch_idx):
            if self.global_step == 2:
                raise ValueError("user's step failed")
            return super().training_step(batch, batch_idx)

    ci.profile(output="none")
    with pytest.raises(ValueError, match="user's step failed"):
        trainer(tmp_path).fit(Broken(), loader(32))
    (train,) = named(root(), "train")
    (epoch,) = kids(train, "epoch")
    failed = kids(epoch, "step")[-1]
    assert failed["index"] == 2
    for node in (train, epoch, failed):
        assert node["end_ns"] is not None and node["status"] == "ERROR"


def test_a_hook_that_raises_does_not_stop_training(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken hook")

    plain = Regression()
    trainer(tmp_path / "a", max_epochs=1).fit(plain, loader(32))
    monkeypatch.setattr(cirron.training, "begin_epoch", broken)
    ci.profile(output="none")
    traced = Regression()
    trainer(tmp_path / "b", max_epochs=1).fit(traced, loader(32))
    assert traced.losses == plain.losses
    assert ci.health()["hook_errors"] >= 1


def test_shutdown_restores_lightning_and_frameworks_torch_leaves_it_alone(tmp_path):
    from lightning.pytorch.trainer.connectors.logger_connector import _LoggerConnector

    before = dict(vars(L.Trainer)), dict(vars(_LoggerConnector))
    ci.profile(output="none")
    assert L.Trainer.__dict__["fit"] is not before[0]["fit"]
    ci.shutdown()
    assert (dict(vars(L.Trainer)), dict(vars(_LoggerConnector))) == before
    ci.profile(output="none", frameworks=["torch"])
    trainer(tmp_path, max_epochs=1).fit(Regression(), loader(32))
    assert named(root(), "train") == []


def test_pytorch_lightning_is_traced_too(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    ci.profile(output="none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = pl.Trainer(
            max_epochs=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
    run.fit(Module(), loader(16))
    assert [e["index"] for e in named(root(), "epoch")] == [0, 1]
    assert len(named(root(), "step")) == 4
