"""The step timeline of plain torch loops whose batches are judged by the work done on them:
evaluation work inside a training step (a teacher, a frozen backbone, an attack), a training
loop whose model is in ``eval()``, an evaluation loop that switches mode after its fetch,
updates made with ``torch.autograd.grad``, and two training loaders in one outer iteration.

Each test is a loop as people write it, over the data-bound loader of
``test_step_timeline.py``; ``timeline.check`` holds for every trace.
"""

from __future__ import annotations

from collections import Counter

import pytest

import cirron as ci
from test_step_timeline import SlowData, finished, setup, train_on
from timeline import check, fetches_in, steps_of
from trees import child_names, kids, named, walk

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def profiled():
    ci.profile(output="none", frameworks=["torch"])


def forwards_by_parent(root: dict) -> Counter:
    """Forward spans by (mode, the name of their parent)."""
    return Counter(
        (child["attributes"]["mode"], node["name"])
        for node in walk(root)
        for child in kids(node, "forward")
    )


def assert_steps_hold_their_work(root: dict, forwards: int, optimizer: bool = True) -> None:
    """Every step holds its fetch, ``forwards`` forwards, a backward and (with ``optimizer``)
    an optimizer step."""
    for step in steps_of(root):
        names = child_names(step)
        assert fetches_in(step) == 1
        assert (names["forward"], names["backward"]) == (forwards, 1)
        assert names["optimizer_step"] == (1 if optimizer else 0)


# -- evaluation work inside a training step -----------------------------------------------------
def test_a_teachers_eval_forward_before_the_students_is_inside_the_step():
    """Knowledge distillation: the teacher in eval() under no_grad, then the student's update."""
    teacher, _, _ = setup(seed=1)
    student, optimizer, loss_fn = setup()
    teacher.eval()
    loader = DataLoader(SlowData(16), batch_size=4)  # 4 batches
    for _epoch in range(2):
        for x, y in loader:
            with torch.no_grad():
                soft = functional.softmax(teacher(x), dim=1)
            logits = student(x)
            loss = loss_fn(logits, y) + functional.kl_div(
                functional.log_softmax(logits, dim=1), soft, reduction="batchmean"
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [4, 4]
    assert_steps_hold_their_work(root, forwards=2)
    assert forwards_by_parent(root) == {("eval", "step"): 8, ("train", "step"): 8}


def test_a_frozen_backbone_in_eval_mode_is_inside_the_steps_of_the_head_it_feeds():
    """Linear probing: ``backbone.eval()`` and no_grad features, a head trained on them; the
    backbone is the only model seen before the first fetch."""
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    head = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    backbone.eval()
    loader = DataLoader(SlowData(16), batch_size=4)
    for _epoch in range(2):
        for x, y in loader:
            with torch.no_grad():
                features = backbone(x)
            loss = nn.functional.cross_entropy(head(features), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [4, 4]
    assert named(root, "validate") == [] and named(root, "evaluate") == []
    assert_steps_hold_their_work(root, forwards=2)
    assert forwards_by_parent(root) == {("eval", "step"): 8, ("train", "step"): 8}


def test_adversarial_examples_made_in_eval_mode_before_the_update_are_inside_the_step():
    """Adversarial training (FGSM): the attack runs the model in eval() and takes the gradient
    of the loss with respect to the input, then the model trains on the perturbed batch."""
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(16), batch_size=4)
    for _epoch in range(2):
        for x, y in loader:
            model.eval()
            x = x.clone().requires_grad_(True)
            (gradient,) = torch.autograd.grad(loss_fn(model(x), y), x)  # not the update
            x_adversarial = (x + 0.1 * gradient.sign()).detach()
            model.train()
            train_on(model, optimizer, loss_fn, x_adversarial, y)

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [4, 4]
    assert named(root, "validate") == [] and named(root, "evaluate") == []
    assert_steps_hold_their_work(root, forwards=2)


# -- a pass judged by its work -------------------------------------------------------------------
def test_a_training_loop_that_forgot_model_train_after_validation_still_trains_in_epochs():
    """``model.eval()`` for validation, and no ``model.train()`` before the next epoch: the
    second epoch trains a model in eval mode, and its batches are still steps."""
    model, optimizer, loss_fn = setup()
    train = DataLoader(SlowData(16), batch_size=4)  # 4 batches
    validation = DataLoader(SlowData(8, seed=1), batch_size=4)  # 2 batches
    for _epoch in range(2):
        for x, y in train:
            train_on(model, optimizer, loss_fn, x, y)
        model.eval()
        with torch.no_grad():
            for x, y in validation:
                loss_fn(model(x), y)

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    assert [kids(e, "validate")[0]["attributes"]["batches"] for e in epochs] == [2, 2]
    assert len(named(root, "validate")) == 2
    assert_steps_hold_their_work(root, forwards=1)
    modes = [f["attributes"]["mode"] for e in epochs for s in kids(e, "step")
             for f in kids(s, "forward")]  # fmt: skip
    assert modes == ["train"] * 4 + ["eval"] * 4  # what the model was in, as it was


def test_an_evaluator_that_calls_model_eval_inside_its_process_function_is_a_validate_pass():
    """pytorch-ignite's shape: a trainer and an evaluator, each a process function called per
    batch; the evaluator's calls ``model.eval()`` and no_grad after its batch was fetched."""
    model, optimizer, loss_fn = setup()
    train = DataLoader(SlowData(16), batch_size=4)
    validation = DataLoader(SlowData(12, seed=1), batch_size=4)  # 3 batches

    def train_step(batch):
        model.train()
        x, y = batch
        return train_on(model, optimizer, loss_fn, x, y)

    def validation_step(batch):
        model.eval()
        with torch.no_grad():
            x, y = batch
            return loss_fn(model(x), y).item()

    def run(loader, process):
        return [process(batch) for batch in loader]

    for _epoch in range(2):
        run(train, train_step)
        run(validation, validation_step)

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    for epoch in epochs:
        (validate,) = kids(epoch, "validate")
        assert validate["attributes"]["batches"] == 3
        assert fetches_in(validate) == 4  # three batches and the dry one
        assert child_names(validate)["forward"] == 3
    assert forwards_by_parent(root) == {("train", "step"): 8, ("eval", "validate"): 6}


def test_a_validation_loop_under_no_grad_without_model_eval_is_a_validate_pass():
    """The model stays in train mode; ``torch.no_grad()`` inside the loop, after the fetch."""
    model, optimizer, loss_fn = setup()
    train = DataLoader(SlowData(16), batch_size=4)
    validation = DataLoader(SlowData(8, seed=1), batch_size=4)  # 2 batches
    for _epoch in range(2):
        for x, y in train:
            train_on(model, optimizer, loss_fn, x, y)
        total = 0.0
        for x, y in validation:
            with torch.no_grad():
                loss = loss_fn(model(x), y).item()
                ci.mark("val_batch_loss", loss)  # a mark under no_grad: evaluation's
            total += loss
        ci.mark("val_loss", total / 2, kind="summary")

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [4, 4]
    for epoch in epochs:
        (validate,) = kids(epoch, "validate")
        assert validate["attributes"]["batches"] == 2
        assert fetches_in(validate) == 3 and child_names(validate)["forward"] == 2
        assert [m["name"] for m in validate["marks"]] == ["val_batch_loss"] * 2
        assert epoch["attributes"]["mark.val_loss"] > 0  # after the pass: the epoch's
    assert forwards_by_parent(root) == {("train", "step"): 8, ("eval", "validate"): 4}


# -- updates without an optimizer ----------------------------------------------------------------
def test_updates_made_by_hand_from_autograd_grad_are_one_step_each():
    """Parameters updated in place from ``torch.autograd.grad(loss, params)``: no optimizer,
    no ``backward()``; the gradient of the loss with respect to the parameters is the
    backward."""
    torch.manual_seed(0)
    model, loss_fn = (
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
        nn.CrossEntropyLoss(),
    )
    parameters = list(model.parameters())
    loader = DataLoader(SlowData(12), batch_size=4)  # 3 batches
    for _epoch in range(2):
        for x, y in loader:
            gradients = torch.autograd.grad(loss_fn(model(x), y), parameters)
            with torch.no_grad():
                for parameter, gradient in zip(parameters, gradients, strict=True):
                    parameter -= 0.1 * gradient

    root = finished()
    check(root, optimizer=False)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [3, 3]
    assert all(not s["attributes"].get("partial") for s in steps_of(root))
    assert_steps_hold_their_work(root, forwards=1, optimizer=False)


# -- loaders as people use them ------------------------------------------------------------------
def test_two_training_loaders_one_after_the_other_are_one_epoch_per_outer_iteration():
    """Two models trained in turn, each on its own loader, inside one loop over the epochs."""
    model_a, optimizer_a, loss_fn = setup(seed=0)
    model_b, optimizer_b, _ = setup(seed=1)
    loader_a = DataLoader(SlowData(12), batch_size=4)  # 3 batches
    loader_b = DataLoader(SlowData(8, seed=1), batch_size=4)  # 2 batches
    for _epoch in range(2):
        for x, y in loader_a:
            train_on(model_a, optimizer_a, loss_fn, x, y)
        for x, y in loader_b:
            train_on(model_b, optimizer_b, loss_fn, x, y)

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [5, 5]
    assert [e["index"] for e in epochs] == [0, 1]
    assert_steps_hold_their_work(root, forwards=1)


def test_a_new_loader_built_for_each_epoch_is_still_one_epoch_each():
    """A DataLoader built inside the loop over the epochs (a sampler seeded per epoch)."""
    model, optimizer, loss_fn = setup()
    data = SlowData(12)
    for epoch in range(3):
        generator = torch.Generator().manual_seed(epoch)
        for x, y in DataLoader(data, batch_size=4, shuffle=True, generator=generator):
            train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [3, 3, 3]
