from __future__ import annotations

import time

import pytest

import cirron as ci


def test_wrappers_pass_items_through_unchanged():
    items = [{"x": 1}, (2, 3), "four"]
    assert list(ci.batches(items)) == items
    assert list(ci.epochs(range(3))) == [0, 1, 2]
    assert len(ci.batches(items)) == 3


def test_epochs_and_batches_make_an_indexed_tree():
    for epoch in ci.epochs(range(2)):
        for batch in ci.batches([10, 20, 30]):
            ci.mark("loss", batch / 10)
        ci.mark("epoch_loss", epoch + 0.5, kind="summary")
    epochs = ci.trace(format="dict", name="epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    for epoch in epochs:
        assert [b["index"] for b in epoch["children"]] == [0, 1, 2]  # restart per epoch
        assert [b["marks"][0]["value"] for b in epoch["children"]] == [1.0, 2.0, 3.0]
        assert "mark.epoch_loss" in epoch["attributes"]


def test_epoch_indexes_count_the_whole_run():
    for _ in ci.epochs(range(2)):
        pass
    for _ in ci.epochs(range(2)):  # e.g. a second phase of training
        pass
    assert [e["index"] for e in ci.trace(format="dict", name="epoch")] == [0, 1, 2, 3]


def test_break_closes_the_open_scope():
    for batch in ci.batches(range(10)):
        if batch == 2:
            break
    with ci.scope("after"):
        pass
    batches = ci.trace(format="dict", name="batch")
    assert len(batches) == 3
    assert all(b["end_ns"] is not None for b in batches)
    (after,) = ci.trace(format="dict", name="after")
    assert after["parent_id"] == ci.trace(format="dict")["span_id"]


def test_exception_in_the_body_propagates_and_closes_scopes():
    with pytest.raises(RuntimeError, match="bad batch"):
        for epoch in ci.epochs(range(3)):
            for batch in ci.batches(range(3)):
                if epoch == 1 and batch == 1:
                    raise RuntimeError("bad batch")
    assert [e["end_ns"] is not None for e in ci.trace(format="dict", name="epoch")] == [True, True]
    assert len(ci.trace(format="dict", name="batch")) == 5


def test_error_from_the_wrapped_iterable_propagates():
    def broken():
        yield 1
        raise OSError("disk gone")

    seen = []
    with pytest.raises(OSError, match="disk gone"):
        for item in ci.batches(broken()):
            seen.append(item)
    assert seen == [1]


def test_not_iterable_is_a_type_error():
    with pytest.raises(TypeError, match="iterable"):
        ci.batches(42)


def test_torch_dataloader_records_the_wait_for_each_batch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class SlowDataset(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.tensor([float(i)])

    for _ in ci.batches(DataLoader(SlowDataset(), batch_size=2)):
        pass
    batches = ci.trace(format="dict", name="batch")
    assert len(batches) == 2
    for batch in batches:
        assert batch["attributes"]["data_load_ns"] >= 35_000_000  # two items of 20 ms


def test_plain_iterables_have_no_data_load_attribute():
    for _ in ci.batches([1, 2]):
        pass
    assert all("data_load_ns" not in b["attributes"] for b in ci.trace(format="dict", name="batch"))
