"""The step timeline of plain torch loops, on a data-bound loader: every loop shape users write
gives the epochs, steps, fetches and passes its code implies, and steps never overlap.

Each test is a loop as people write it (a tutorial's, a library's recipe), over a dataset
that sleeps for every sample, so that a step holding the wrong fetch shows. The rules every
trace keeps are checked by ``timeline.check``: steps and epochs never overlap, every fetch
sits in one step or pass (or its epoch), the steps add up to no more than the loop.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter

import pytest

import cirron as ci
from support import prefetching
from timeline import check, fetches_in, input_share, steps_of, timed
from trees import child_names, kids, named, walk

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DELAY = 0.002  # seconds a sample takes to load: a batch of 4 waits 8 ms


class SlowData(Dataset):
    """A data set that takes ``delay`` seconds a sample, as reading and decoding does."""

    def __init__(self, samples: int, delay: float = DELAY, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, 4, generator=generator)
        self.y = torch.randint(0, 2, (samples,), generator=generator)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        time.sleep(self.delay)
        return self.x[index], self.y[index]


def setup(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()


def train_on(model, optimizer, loss_fn, x, y) -> float:
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def finished() -> dict:
    ci.shutdown()  # ends the last epoch
    return ci.trace(format="dict")


@pytest.fixture(autouse=True)
def profiled():
    ci.profile(output="none", frameworks=["torch"])


# -- the step boundary --------------------------------------------------------------------------
def test_a_data_bound_loop_has_steps_that_hold_their_own_fetch_and_never_overlap():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(20, delay=0.005), batch_size=4)  # 20 ms a batch
    with timed() as wall:
        for _epoch in range(2):
            for x, y in loader:
                train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root, wall_ns=wall[0])
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [5, 5]
    for step in steps_of(root):
        assert fetches_in(step) == 1  # its own, not the next step's
        (load,) = kids(step, "data_load")
        assert load["start_ns"] == step["start_ns"]  # a step begins where its fetch begins
        assert load["end_ns"] - load["start_ns"] >= 20_000_000  # the four 5 ms waits in it
    for epoch in epochs:  # the fetch that found the loader dry is the epoch's
        assert fetches_in(epoch) == 1
    # What the loop waits on: data (over 0.9 on an idle machine; a busy one stretches the
    # model's work, never the waits, so the verdict holds with room).
    assert input_share(root) > 0.6


def test_ci_batches_over_a_data_bound_loader_holds_each_fetch_in_its_own_batch():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(20, delay=0.01), batch_size=4)  # 40 ms a batch
    with timed() as wall:
        for _epoch in ci.epochs(range(2)):
            for x, y in ci.batches(loader):
                train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root, wall_ns=wall[0])
    batches = steps_of(root)
    assert [b["index"] for b in batches] == [0, 1, 2, 3, 4] * 2
    for before, after in itertools.pairwise(batches):
        if before["index"] < 4:  # in an epoch: a batch ends where the next one's fetch begins
            assert before["end_ns"] == after["start_ns"]
    for batch in batches:
        (load,) = kids(batch, "data_load")
        assert load["start_ns"] == batch["start_ns"]  # a batch begins where its fetch begins
        assert batch["attributes"]["data_load_ns"] == load["end_ns"] - load["start_ns"]
    # What the loop waits on: data (0.96 on an idle machine). The batches take 40 ms: at 20 ms,
    # a busy machine's cold first backward took more than the tenth the bar leaves.
    assert input_share(root) > 0.9


def test_gradient_accumulation_puts_every_micro_batch_fetch_in_the_step_it_feeds():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(32), batch_size=4)  # 8 batches
    with timed() as wall:
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / 4).backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()

    root = finished()
    check(root, wall_ns=wall[0])
    assert [fetches_in(s) for s in steps_of(root)] == [4, 4]


def test_a_step_whose_epoch_ends_before_its_optimizer_step_says_it_is_partial():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(20), batch_size=4)  # 5 batches, accumulation over 2
    for _epoch in range(2):
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / 2).backward()
            if (i + 1) % 2 == 0:
                optimizer.step()
                optimizer.zero_grad()
        ci.mark("epoch_done", 1)

    root = finished()
    check(root)
    for epoch in named(root, "epoch"):
        steps = kids(epoch, "step")
        assert [fetches_in(s) for s in steps] == [2, 2, 1]
        assert [s["attributes"].get("partial", False) for s in steps] == [False, False, True]
        assert [m["name"] for m in epoch["marks"]] == ["epoch_done"]  # after the loop


def test_a_scope_between_the_fetch_and_the_forward_is_inside_the_step():
    model, optimizer, loss_fn = setup()
    for x, y in DataLoader(SlowData(8), batch_size=4):
        with ci.scope("augment"):
            x = x + 0.01 * torch.randn_like(x)
        ci.mark("lr", 0.1)
        train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    for step in steps_of(root):
        assert child_names(step)["augment"] == 1
        assert [m["name"] for m in step["marks"]] == ["lr"]
        assert step["children"][0]["name"] == "data_load"


# -- evaluation passes ------------------------------------------------------------------------
def test_validation_after_each_epoch_is_a_validate_pass_that_holds_its_fetches():
    model, optimizer, loss_fn = setup()
    train = DataLoader(SlowData(20), batch_size=4)
    validation = DataLoader(SlowData(12, seed=1), batch_size=4)
    for _epoch in range(2):
        model.train()
        for x, y in train:
            train_on(model, optimizer, loss_fn, x, y)
        model.eval()
        with torch.no_grad():
            for x, y in validation:
                ci.mark("val_loss", loss_fn(model(x), y))
        ci.mark("val_done", 1, kind="summary")

    root = finished()
    check(root)
    for epoch in named(root, "epoch"):
        (validate,) = kids(epoch, "validate")
        assert validate["attributes"] == {"index": epoch["index"], "batches": 3}
        assert fetches_in(validate) == 4  # three batches and the dry one
        assert child_names(validate)["forward"] == 3
        assert len(validate["marks"]) == 3
        assert epoch["attributes"]["mark.val_done"] == 1  # after the pass: the epoch's
        assert validate["start_ns"] >= kids(epoch, "step")[-1]["end_ns"]
    assert len(named(root, "step")) == 10


def test_evaluation_on_the_training_loader_in_eval_mode_alone_is_a_pass_not_an_epoch():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(20), batch_size=4)
    for _epoch in range(2):
        model.train()
        for x, y in loader:
            train_on(model, optimizer, loss_fn, x, y)
        model.eval()  # no torch.no_grad(): gradients on, the model in eval mode
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in loader)
        ci.mark("accuracy", correct / 20, kind="summary")

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert len(epochs) == 2 and len(named(root, "step")) == 10
    for epoch in epochs:
        (validate,) = kids(epoch, "validate")
        assert validate["attributes"]["batches"] == 5
        assert {f["attributes"]["mode"] for f in kids(validate, "forward")} == {"eval"}


def test_mid_epoch_validation_takes_no_fetch_from_the_training_step_before_it():
    model, optimizer, loss_fn = setup()
    train = DataLoader(SlowData(24), batch_size=4)  # 6 batches
    validation = DataLoader(SlowData(8, seed=1), batch_size=4)
    for i, (x, y) in enumerate(train):
        train_on(model, optimizer, loss_fn, x, y)
        if i % 3 == 2:  # every 3 steps
            model.eval()
            with torch.no_grad():
                for vx, _vy in validation:
                    model(vx)
            model.train()

    root = finished()
    check(root)
    (epoch,) = named(root, "epoch")
    assert [s["name"] for s in epoch["children"] if s["name"] in ("step", "validate")] == [
        "step", "step", "step", "validate", "step", "step", "step", "validate",
    ]  # fmt: skip
    assert all(fetches_in(s) == 1 for s in kids(epoch, "step"))
    assert all(fetches_in(v) == 3 for v in kids(epoch, "validate"))


def test_a_users_own_validate_scope_is_the_pass_and_a_scope_around_one_ends_it():
    model, optimizer, loss_fn = setup()
    train = DataLoader(SlowData(8), batch_size=4)
    validation = DataLoader(SlowData(12, seed=1), batch_size=4)
    for _epoch in range(2):
        for x, y in train:
            train_on(model, optimizer, loss_fn, x, y)
        model.eval()
        with ci.scope("validate"), torch.no_grad():  # the user names the pass
            for x, _y in validation:
                model(x)
        with ci.scope("quick_check"), torch.no_grad():  # a scope around a pass cut short
            for x, _y in validation:
                model(x)
                break
        model.train()

    root = finished()
    check(root)
    for epoch in named(root, "epoch"):
        (own,) = kids(epoch, "validate")  # one pass, the user's: no second one inside
        assert named(own, "validate") == [own]
        assert child_names(own)["forward"] == 3 and fetches_in(own) == 4
        (around,) = kids(epoch, "quick_check")
        (cut_short,) = kids(around, "validate")  # ours, ended with the scope around it
        assert cut_short["end_ns"] <= around["end_ns"]
        assert cut_short["attributes"]["batches"] == 1


def test_evaluation_outside_any_training_is_an_evaluate_pass():
    model, _optimizer, loss_fn = setup()
    model.eval()
    with torch.no_grad():
        for x, y in DataLoader(SlowData(8), batch_size=4):
            ci.mark("loss", loss_fn(model(x), y))

    root = finished()
    check(root)
    assert named(root, "epoch") == [] and named(root, "step") == []
    (evaluate,) = named(root, "evaluate")
    assert evaluate["attributes"] == {"batches": 2}
    assert fetches_in(evaluate) == 3 and len(evaluate["marks"]) == 2


def test_a_no_grad_forward_in_train_mode_is_an_eval_forward_outside_the_steps():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(8), batch_size=4)
    for _epoch in range(2):
        for x, y in loader:
            train_on(model, optimizer, loss_fn, x, y)
        with torch.no_grad():  # the model is still in train mode
            model(x)

    root = finished()
    check(root)
    modes = Counter((f["attributes"]["mode"], parent["name"]) for parent in walk(root)
                    for f in kids(parent, "forward"))  # fmt: skip
    assert modes == {("train", "step"): 4, ("eval", "epoch"): 2}


# -- loaders as people use them ------------------------------------------------------------------
def test_a_loader_peeked_at_before_each_epoch_opens_no_epoch_and_no_step():
    """PyTorch's DDP tutorial series: ``b_sz = len(next(iter(self.train_data))[0])``."""
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(16), batch_size=4)
    for _epoch in range(2):
        batch_size = len(next(iter(loader))[0])
        assert batch_size == 4
        for x, y in loader:
            train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [4, 4]
    assert all(fetches_in(s) == 1 for s in steps_of(root))


def test_zipped_loaders_are_one_epoch_whose_steps_hold_a_fetch_of_each():
    """Semi-supervised learning, domain adaptation: a labelled and an unlabelled loader."""
    model, optimizer, loss_fn = setup()
    labelled = DataLoader(SlowData(24), batch_size=4)  # 6 batches
    unlabelled = DataLoader(SlowData(32, seed=1), batch_size=4)  # 8 batches
    with timed() as wall:
        for _epoch in range(3):
            for (xa, ya), (xb, _) in zip(labelled, unlabelled, strict=False):  # the shorter ends it
                optimizer.zero_grad()
                (loss_fn(model(xa), ya) + model(xb).pow(2).mean()).backward()
                optimizer.step()

    root = finished()
    check(root, wall_ns=wall[0])
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [6, 6, 6]
    assert all(fetches_in(s) == 2 for s in steps_of(root))


def test_loaders_taken_in_turns_are_one_epoch():
    """A multi-task loop: each step trains on the next task's loader."""
    model, optimizer, loss_fn = setup()
    tasks = [DataLoader(SlowData(12, seed=s), batch_size=4) for s in (0, 1)]  # 3 batches each
    for _epoch in range(2):
        iterators = [iter(task) for task in tasks]
        for turn in range(6):
            x, y = next(iterators[turn % 2])
            train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [6, 6]


def test_a_loop_that_skips_the_tail_of_each_epoch_has_no_empty_steps():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(24), batch_size=4)  # 6 batches, 2 trained on
    for _epoch in range(2):
        for i, (x, y) in enumerate(loader):
            if i >= 2:
                continue
            train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    for epoch in named(root, "epoch"):
        assert len(kids(epoch, "step")) == 2
        assert fetches_in(epoch) == 5  # the four skipped fetches and the dry one


def test_a_loader_with_persistent_workers_left_by_break_is_a_new_pass_each_epoch():
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(40), batch_size=4, num_workers=1, persistent_workers=True)
    for _epoch in range(3):
        for i, (x, y) in enumerate(loader):
            train_on(model, optimizer, loss_fn, x, y)
            if i == 2:
                break

    root = finished()
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [3, 3, 3]


def test_a_fetch_that_raises_and_is_skipped_is_a_failed_data_load_in_the_step_it_fed():
    class Flaky(SlowData):
        def __getitem__(self, index):
            if index == 5:
                time.sleep(0.02)
                raise ValueError("corrupt sample")
            return super().__getitem__(index)

    model, optimizer, loss_fn = setup()
    iterator = iter(DataLoader(Flaky(8), batch_size=1))
    while True:
        try:
            x, y = next(iterator)
        except StopIteration:
            break
        except ValueError:
            continue  # skip the bad sample
        train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    steps = steps_of(root)
    assert len(steps) == 7
    (failed,) = [n for n in walk(root) if n["name"] == "data_load" and n["status"] == "ERROR"]
    (holder,) = [s for s in steps if failed in s["children"]]
    assert [c["name"] for c in holder["children"]][:2] == ["data_load", "data_load"]
    assert failed["events"][0]["attributes"]["exception.type"] == "ValueError"
    assert failed["end_ns"] - failed["start_ns"] >= 20_000_000  # its wait is its own


def test_a_prefetching_wrapper_gives_the_last_batch_to_the_epochs_last_step():
    """Image-model scripts: a generator that fetches batch i+1 before handing out batch i."""
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(20), batch_size=4)  # 5 batches, accumulation over 2
    for _epoch in range(2):
        for i, (x, y) in enumerate(prefetching(loader)):
            (loss_fn(model(x), y) / 2).backward()
            ci.mark("loss", 1.0)
            if i % 2 == 1 or i == 4:
                optimizer.step()
                optimizer.zero_grad()

    root = finished()
    check(root)
    for epoch in named(root, "epoch"):
        steps = kids(epoch, "step")
        assert [child_names(s)["forward"] for s in steps] == [2, 2, 1]
        assert [child_names(s)["optimizer_step"] for s in steps] == [1, 1, 1]
        assert [len(s["marks"]) for s in steps] == [2, 2, 1]


def test_a_dataloader_subclass_that_fetches_ahead_is_timed_where_the_loop_waits():
    class PrefetchingLoader(DataLoader):
        def __iter__(self):
            batches = super().__iter__()
            upcoming = next(batches)
            for batch in batches:
                yield upcoming
                upcoming = batch
            yield upcoming

    class Logged(SlowData):
        """Notes when each sample was loaded: which wait held it does not depend on load."""

        loaded: list[int] = []

        def __getitem__(self, index):
            self.loaded.append(time.time_ns())
            return super().__getitem__(index)

    model, optimizer, loss_fn = setup()
    loader = PrefetchingLoader(Logged(20), batch_size=4)  # 5 batches
    with timed() as wall:
        for _epoch in range(2):
            for x, y in loader:
                train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root, wall_ns=wall[0])
    for epoch in named(root, "epoch"):
        steps = kids(epoch, "step")
        assert [fetches_in(s) for s in steps] == [1, 1, 1, 1, 1]  # the loop's wait, once
        first, second = (kids(s, "data_load")[0] for s in steps[:2])
        # the first wait holds two batches' loading (it fetches ahead), the others one
        assert [
            sum(wait["start_ns"] <= at <= wait["end_ns"] for at in Logged.loaded)
            for wait in (first, second)
        ] == [8, 4]
        assert fetches_in(epoch) == 1


def test_an_accelerate_loop_with_accumulation_has_one_step_per_optimizer_step():
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(32), batch_size=4)  # 8 batches
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _epoch in range(2):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
            ci.mark("loss", 1.0)

    root = finished()
    check(root)
    for epoch in named(root, "epoch"):
        steps = kids(epoch, "step")
        assert [child_names(s)["forward"] for s in steps] == [2, 2, 2, 2]
        assert all(len(s["marks"]) == 2 for s in steps)
    assert len(named(root, "step")) == 8


def test_a_step_the_grad_scaler_skips_is_still_a_step_and_says_so():
    """The AMP recipe: ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``."""
    model, optimizer, loss_fn = setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for i, (x, y) in enumerate(DataLoader(SlowData(32), batch_size=4)):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        if i in (2, 5):  # the gradients overflow
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    root = finished()
    check(root)
    steps = steps_of(root)
    assert len(steps) == 8
    skipped = [s["index"] for s in steps if s["attributes"].get("skipped")]
    assert skipped == [2, 5]
    assert [steps[i]["attributes"]["loss_scale"] for i in skipped] == [1024.0, 512.0]
    for step in steps:
        assert child_names(step)["forward"] == 1
        (moment,) = kids(step, "optimizer_step")
        assert moment["attributes"].get("skipped", False) is (step["index"] in skipped)


# -- what torch does inside a call ------------------------------------------------------------
def test_activation_checkpointing_recomputes_inside_backward_and_is_never_an_error():
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(4, 8), nn.Linear(8, 2)

        def forward(self, x):
            hidden = checkpoint(self.first, x, use_reentrant=False).relu()
            return checkpoint(self.second, hidden, use_reentrant=True)

    model = Checkpointed()
    optimizer, loss_fn = torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()
    for x, y in DataLoader(SlowData(12), batch_size=4):
        train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    for step in steps_of(root):
        (forward,) = kids(step, "forward")  # one training forward a step
        assert forward["attributes"] == {"mode": "train", "module": "Checkpointed"}
        (backward,) = kids(step, "backward")
        recomputed = kids(backward, "forward")
        assert len(recomputed) == 2
        assert all(f["attributes"]["recompute"] is True for f in recomputed)
    assert all(n["status"] != "ERROR" for n in walk(root))


def test_an_optimizer_step_that_raises_ends_with_the_error_inside_its_step():
    """LBFGS with a closure that raises: the error reaches the user, the span has it."""
    model, _optimizer, loss_fn = setup()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
    loader = DataLoader(SlowData(8), batch_size=4)
    with pytest.raises(RuntimeError, match="closure failed"):
        for i, (x, y) in enumerate(loader):

            def closure(x=x, y=y, i=i):
                if i == 1:
                    raise RuntimeError("closure failed")
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                return loss

            optimizer.step(closure)

    root = finished()
    steps = steps_of(root)
    (failed,) = kids(steps[1], "optimizer_step")
    assert failed["status"] == "ERROR"
    assert failed["end_ns"] < steps[1]["end_ns"]  # ended when it raised, not at exit
    assert failed["events"][0]["attributes"]["exception.message"] == "closure failed"


def test_wrapped_models_are_named_by_the_users_class_with_the_wrapper_beside():
    model, optimizer, loss_fn = setup()
    wrapped = nn.DataParallel(model)
    for x, y in DataLoader(SlowData(8), batch_size=4):
        train_on(wrapped, optimizer, loss_fn, x, y)

    root = finished()
    for forward in named(root, "forward"):
        assert forward["attributes"]["module"] == "Sequential"
        assert forward["attributes"]["wrapper"] == "DataParallel"


def test_a_failing_settle_hook_leaves_training_alone(monkeypatch, caplog):
    from cirron.instrumentors.torch_steps import TorchLoop

    def broken(self):
        raise RuntimeError("deliberately broken hook")

    monkeypatch.setattr(TorchLoop, "settle", broken)
    model, optimizer, loss_fn = setup()
    with caplog.at_level(logging.WARNING, logger="cirron"):
        for x, y in DataLoader(SlowData(8), batch_size=4):
            with ci.scope("augment"):
                pass
            train_on(model, optimizer, loss_fn, x, y)
    assert ci.health()["hook_errors"] == 2
    assert len(named(finished(), "step")) == 2


def test_a_loop_that_does_no_torch_work_opens_nothing_and_keeps_no_backlog():
    """Data statistics, or batches for a model of another library: no epoch, no step."""
    from cirron.instrumentors.torch_steps import MAX_WAITING
    from cirron.recording.training_state import pending_fetches

    longest = 0
    for x, _y in DataLoader(SlowData(400, delay=0), batch_size=2):  # 200 batches
        _ = float(x.sum())
        longest = max(longest, len(pending_fetches))

    root = finished()
    assert longest <= MAX_WAITING
    assert named(root, "epoch") == [] and named(root, "step") == []
    assert len(named(root, "data_load")) == 201  # every fetch, where the program was


def test_an_epoch_that_begins_a_trace_of_its_own_still_begins_at_its_first_fetch():
    ci.shutdown()
    ci.profile(output="none", frameworks=["torch"], config={"trace_split": 2})
    model, optimizer, loss_fn = setup()
    loader = DataLoader(SlowData(12), batch_size=4)
    for _epoch in range(3):
        for x, y in loader:
            train_on(model, optimizer, loss_fn, x, y)

    root = finished()
    check(root)
    epochs = named(root, "epoch")
    assert len(epochs) == 3
    assert epochs[-1]["attributes"].get("cirron.parent_span_id")  # a trace of its own
    for epoch in epochs:
        assert epoch["start_ns"] == kids(epoch, "step")[0]["start_ns"]
