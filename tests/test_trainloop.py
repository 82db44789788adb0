"""The trainloop instrumentor on real ``BaseTrainer`` subclasses: a small torch model, in-memory data.

Each test is a user's script: a trainer subclass written as trainloop's docs
say, ``ci.profile()``, ``trainer.train()``; then the spans read back with
``ci.trace(format="dict")``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import cirron as ci
from trees import kids, named

torch = pytest.importorskip("torch")
trainloop = pytest.importorskip("trainloop")

from trainloop import BaseHook, BaseTrainer, CheckpointingHook, ProgressHook  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class LogsScalars(BaseHook):
    """A user's hook that logs nested records after every step."""

    def on_after_step(self, trainer):
        trainer.log_scalars({"loss": {"scaled": 10.0 * trainer.step}, "step": trainer.step})


class Regression(BaseTrainer):
    """A user's trainer: a linear model on random data, hooks as given."""

    def __init__(self, *args, hooks=(), nan_at=(), **kwargs):
        super().__init__(*args, **kwargs)
        self._hooks = list(hooks)
        self.nan_at = set(nan_at)  # (step, attempt) pairs whose loss is NaN
        self.attempts: dict[int, int] = {}
        self.losses: list[float] = []

    def build_data_loader(self):
        generator = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(
            torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)
        )

        def forever():
            while True:
                yield from torch.utils.data.DataLoader(data, batch_size=8)

        return forever()

    def build_model(self):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def build_optimizer(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.05)

    def build_hooks(self):
        return list(self._hooks)

    def forward(self, batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        attempt = self.attempts.get(self.step, 0)
        self.attempts[self.step] = attempt + 1
        if (self.step, attempt) in self.nan_at:
            loss = loss * float("nan")
        self.losses.append(loss.item())
        return loss, {"mse": loss.item()}


def root() -> dict:
    return ci.trace(format="dict")


def test_one_step_per_training_step_with_its_micro_steps_marks_and_checkpoints(tmp_path):
    ci.profile(output="none")
    trainer = Regression(
        max_steps=4,
        gradient_accumulation_steps=2,
        workspace=tmp_path,
        hooks=[ProgressHook(interval=2), CheckpointingHook(interval=3), LogsScalars()],
    )
    trainer.train()
    (train,) = named(root(), "train")
    assert train["attributes"] == {"max_steps": 4, "gradient_accumulation_steps": 2}
    (epoch,) = kids(train, "epoch")  # a fallback epoch: trainloop counts steps only
    steps = kids(epoch, "step")
    assert [s["index"] for s in steps] == [0, 1, 2, 3]
    for step in steps:
        names = [c["name"] for c in step["children"]]
        assert names[:7] == ["data_load", "forward", "backward"] * 2 + ["optimizer_step"]
        points = {m["name"]: m["value"] for m in step["marks"]}
        assert points["loss/scaled"] == 10.0 * (step["index"] + 1)  # nested keys with "/"
        assert points["step"] == step["index"] + 1
    # ProgressHook's statistics every 2 steps, on the step that ends the interval
    for step in (steps[1], steps[3]):
        points = {m["name"] for m in step["marks"]}
        assert {"loss", "step_time", "data_time", "lr", "mse"} <= points
    assert "lr" not in {m["name"] for m in steps[0]["marks"]}
    checkpoints = named(root(), "checkpoint")
    assert [Path(c["attributes"]["path"]).name for c in checkpoints] == ["3", "4"]
    assert Path(checkpoints[-1]["attributes"]["path"]).is_dir()  # the older one was pruned
    assert Path(checkpoints[0]["attributes"]["path"]).parent == tmp_path / "checkpoints"


def test_the_trainers_model_is_snapshotted_at_the_end_of_each_epoch(tmp_path):
    ci.profile(output="none", config={"epoch_steps": 2})
    Regression(max_steps=5, workspace=tmp_path).train()
    ci.flush()
    epochs = named(root(), "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [2, 2, 1]
    snapshots = [kids(e, "snapshot") for e in epochs]
    assert [len(s) for s in snapshots] == [1, 1, 1]
    events = {e["name"]: e["attributes"]["kind"] for e in snapshots[0][0]["events"]}
    assert events["0.weight"] == "weight"
    assert snapshots[0][0]["attributes"]["snapshot.model"] == "Sequential"


def test_a_resumed_run_goes_on_from_its_checkpoints_step(tmp_path):
    ci.profile(output="none")
    Regression(max_steps=3, workspace=tmp_path, hooks=[CheckpointingHook(interval=3)]).train()
    Regression(max_steps=5, workspace=tmp_path, hooks=[CheckpointingHook(interval=3)]).train()
    first, second = named(root(), "train")
    assert [s["index"] for s in named(first, "step")] == [0, 1, 2]
    assert [s["index"] for s in named(second, "step")] == [3, 4]


def test_two_trainings_in_one_process_each_have_their_epochs_and_their_own_snapshots(tmp_path):
    ci.profile(output="none")
    Regression(max_steps=3, workspace=tmp_path / "a").train()
    Regression(max_steps=3, workspace=tmp_path / "b").train()
    ci.flush()
    first, second = named(root(), "train")
    for train in (first, second):
        (epoch,) = kids(train, "epoch")
        assert epoch["index"] == 0  # each training's epochs count from 0, as its steps do
        (snapshot,) = kids(epoch, "snapshot")  # its own model's, not the first run's too
        assert snapshot["attributes"]["snapshot.model"] == "Sequential"


def test_a_retried_step_with_non_finite_gradients_carries_the_retry_count(tmp_path):
    ci.profile(output="none")
    trainer = Regression(
        max_steps=3, max_non_finite_grad_retries=3, workspace=tmp_path, nan_at={(2, 0)}
    )
    trainer.train()
    steps = named(root(), "step")
    assert [s["index"] for s in steps] == [0, 1, 2]
    retried = steps[1]
    assert retried["attributes"]["non_finite_grad_retries"] == 1
    (event,) = [e for e in retried["events"] if e["name"] == "non_finite_grad_retry"]
    assert event["attributes"]["retries"] == 1
    assert len(kids(retried, "forward")) == 2  # the failed attempt and the retry
    assert "non_finite_grad_retries" not in steps[0]["attributes"]
    assert not math.isnan(trainer.losses[-1])


def test_a_step_out_of_retries_fails_and_still_says_how_often_it_was_retried(tmp_path):
    ci.profile(output="none")
    trainer = Regression(
        max_steps=3, max_non_finite_grad_retries=2, workspace=tmp_path,
        nan_at={(2, 0), (2, 1), (2, 2)},
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="Exceeded maximum retries"):
        trainer.train()
    failed = named(root(), "step")[-1]
    assert failed["index"] == 1 and failed["status"] == "ERROR"
    assert failed["attributes"]["non_finite_grad_retries"] == 2
    assert [e["name"] for e in failed["events"]][:1] == ["non_finite_grad_retry"]
    assert len(kids(failed, "forward")) == 3  # the try and both retries


def test_results_are_identical_to_an_unprofiled_run(tmp_path):
    plain = Regression(max_steps=6, gradient_accumulation_steps=2, workspace=tmp_path / "a")
    plain.train()
    ci.profile(output="none", snapshots="full", path=str(tmp_path / "run"))
    traced = Regression(max_steps=6, gradient_accumulation_steps=2, workspace=tmp_path / "b")
    traced.train()
    assert traced.losses == plain.losses
    for a, b in zip(plain.model.parameters(), traced.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_error_in_train_reaches_the_user_and_ends_the_spans_with_it(tmp_path):
    class Broken(Regression):
        def forward(self, batch):
            if self.step == 2:
                raise RuntimeError("user's forward failed")
            return super().forward(batch)

    ci.profile(output="none")
    with pytest.raises(RuntimeError, match="user's forward failed"):
        Broken(max_steps=4, workspace=tmp_path).train()
    (train,) = named(root(), "train")
    (epoch,) = kids(train, "epoch")
    failed = kids(epoch, "step")[-1]
    assert failed["index"] == 1
    for node in (train, epoch, failed):
        assert node["end_ns"] is not None and node["status"] == "ERROR"


def test_a_hook_that_raises_does_not_stop_training(tmp_path, monkeypatch):
    import cirron.training

    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken hook")

    monkeypatch.setattr(cirron.training, "begin_step", broken)
    plain = Regression(max_steps=3, workspace=tmp_path / "a")
    plain.train()
    ci.profile(output="none")
    traced = Regression(max_steps=3, workspace=tmp_path / "b")
    traced.train()
    assert traced.losses == plain.losses
    assert ci.health()["hook_errors"] >= 3  # ours each step, and the torch hooks' tries


def test_shutdown_restores_trainloop_and_frameworks_torch_leaves_it_alone(tmp_path):
    before = dict(vars(BaseTrainer)), dict(vars(CheckpointingHook))
    ci.profile(output="none")
    assert BaseTrainer.__dict__["train"] is not before[0]["train"]
    ci.shutdown()
    assert (dict(vars(BaseTrainer)), dict(vars(CheckpointingHook))) == before
    ci.profile(output="none", frameworks=["torch"])
    assert BaseTrainer.__dict__["train"] is before[0]["train"]
    Regression(max_steps=2, workspace=tmp_path).train()
    assert named(root(), "train") == []  # the torch hooks alone: their own steps
    assert len(named(root(), "step")) == 2
