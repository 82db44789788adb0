"""The torch hooks on real training loops: steps, epochs, and what lands where."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

import cirron as ci
from support import run_python

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def make_loader(samples=20, batch_size=4):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(samples, 8, generator=generator),
        torch.randint(0, 2, (samples,), generator=generator),
    )
    return DataLoader(data, batch_size=batch_size)


def make_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()


def children(node, name):
    return [c for c in node["children"] if c["name"] == name]


def test_a_plain_loop_gives_epochs_of_steps():
    ci.profile(output="none", frameworks=["torch"])
    model, optimizer, loss_fn = make_model()
    loader = make_loader()  # 5 batches
    for _epoch in range(2):
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss.item())
        ci.mark("epoch_done", 1, kind="summary")
    root = ci.trace(format="dict")
    epochs = children(root, "epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    steps = [s for e in epochs for s in children(e, "step")]
    assert [s["index"] for s in steps] == list(range(10))
    for step in steps:
        names = Counter(c["name"] for c in step["children"])
        assert names == {
            "data_load": 1,
            "forward": 1,
            "loss": 1,
            "backward": 1,
            "optimizer_step": 1,
        }
        (forward,) = children(step, "forward")
        assert forward["attributes"]["mode"] == "train"
        assert [m["name"] for m in step["marks"]] == ["loss"]  # marked after optimizer.step()
    assert all("mark.epoch_done" in e["attributes"] for e in epochs)  # after the inner loop


def test_validation_lands_in_the_epoch_without_steps():
    ci.profile(output="none", frameworks=["torch"])
    model, optimizer, loss_fn = make_model()
    train, validation = make_loader(), make_loader(samples=8)
    for epoch in range(2):
        model.train()
        for inputs, labels in train:
            optimizer.zero_grad()
            loss_fn(model(inputs), labels).backward()
            optimizer.step()
        model.eval()
        if epoch == 0:
            with torch.no_grad():
                for inputs, _ in validation:
                    model(inputs)
        else:  # eval() alone, no no_grad(): still not a training loader
            for inputs, _ in validation:
                model(inputs)
    root = ci.trace(format="dict")
    epochs = children(root, "epoch")
    assert len(epochs) == 2
    assert sum(len(children(e, "step")) for e in epochs) == 10
    for epoch in epochs:
        evals = children(epoch, "forward")
        assert len(evals) == 2 and all(f["attributes"]["mode"] == "eval" for f in evals)


def test_gradient_accumulation_is_one_step():
    ci.profile(output="none", frameworks=["torch"])
    model, optimizer, loss_fn = make_model()
    loader = make_loader(samples=32)  # 8 batches
    for _epoch in range(2):
        for i, (inputs, labels) in enumerate(loader):
            loss_fn(model(inputs), labels).backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
    steps = ci.trace(format="dict", name="step")
    assert len(steps) == 4
    for step in steps:
        names = Counter(c["name"] for c in step["children"])
        assert names["forward"] == 4 and names["backward"] == 4 and names["data_load"] == 4
        assert names["optimizer_step"] == 1


def test_without_a_dataloader_epochs_are_every_n_steps():
    ci.profile(output="none", frameworks=["torch"], config={"epoch_steps": 3})
    model, optimizer, loss_fn = make_model()
    batches = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(7)]
    for inputs, labels in batches:
        optimizer.zero_grad()
        loss_fn(model(inputs), labels).backward()
        optimizer.step()
    epochs = ci.trace(format="dict", name="epoch")
    assert [e["index"] for e in epochs] == [0, 1, 2]
    assert [[s["index"] for s in children(e, "step")] for e in epochs] == [
        [0, 1, 2],
        [3, 4, 5],
        [6],
    ]


def test_the_readme_loop_with_wrappers_has_no_duplicate_epochs_or_steps():
    ci.profile(output="none", frameworks=["torch"])
    model, optimizer, loss_fn = make_model()
    loader = make_loader()
    for _epoch in ci.epochs(range(2)):
        for inputs, labels in ci.batches(loader):
            optimizer.zero_grad()
            loss_fn(model(inputs), labels).backward()
            optimizer.step()
    root = ci.trace(format="dict")
    epochs = children(root, "epoch")
    assert len(epochs) == 2 and len(ci.trace(format="dict", name="epoch")) == 2
    assert ci.trace(format="dict", name="step") == []
    for epoch in epochs:
        batches = children(epoch, "batch")
        assert len(batches) == 5
        for batch in batches:
            names = Counter(c["name"] for c in batch["children"])
            assert names == {"forward": 1, "loss": 1, "backward": 1, "optimizer_step": 1}


def test_a_failing_hook_leaves_training_unchanged(monkeypatch, caplog):
    def train():
        model, optimizer, loss_fn = make_model()
        losses = []
        for inputs, labels in make_loader():
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    expected = train()
    import cirron.training

    def broken(self, *args, **kwargs):
        raise RuntimeError("hook bug")

    monkeypatch.setattr(cirron.training.TrainingLoop, "training_fetch", broken)
    monkeypatch.setattr(cirron.training.TrainingLoop, "optimizer_stepped", broken)
    with caplog.at_level(logging.WARNING, logger="cirron"):
        ci.profile(output="none", frameworks=["torch"])
        assert train() == expected
    assert ci.health()["hook_errors"] >= 10
    assert sum("hook bug" in r.getMessage() for r in caplog.records) == 1


def test_uninstrument_leaves_torch_as_it_was():
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    originals = (
        nn.Module.__call__,
        torch.Tensor.backward,
        torch.autograd.backward,
        _BaseDataLoaderIter.__next__,
    )
    ci.profile(output="none", frameworks=["torch"])
    assert nn.Module.__call__ is not originals[0]
    ci.shutdown()
    assert (
        nn.Module.__call__,
        torch.Tensor.backward,
        torch.autograd.backward,
        _BaseDataLoaderIter.__next__,
    ) == originals
    ci.profile(output="none", frameworks=[])  # no hooks this time
    model, optimizer, loss_fn = make_model()
    loss_fn(model(torch.randn(2, 8)), torch.tensor([0, 1])).backward()
    optimizer.step()
    assert ci.health()["spans_started"] == 1  # only the session


def test_hooks_attach_when_the_script_imports_torch_later(tmp_path):
    result = run_python(
        """
        import sys
        import cirron as ci
        ci.profile(output="none")
        assert "torch" not in sys.modules
        assert ci.health()["hooks"] == []
        import torch
        assert ci.health()["hooks"] == ["torch"], ci.health()["hooks"]
        model = torch.nn.Linear(3, 1)
        model(torch.randn(2, 3)).sum().backward()
        assert [n["name"] for n in ci.trace(format="dict", name="forward")] == ["forward"]
        print("ok")
        """,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok" in result.stdout
