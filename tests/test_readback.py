from __future__ import annotations

import json
import sys

import pytest

import cirron as ci


def small_run():
    for _epoch in ci.epochs(range(2)):
        for batch in ci.batches(range(3)):
            with ci.scope("forward"):
                pass
            ci.mark("loss", 1.0 / (batch + 1))
        ci.mark("epoch_loss", 0.5, kind="summary")


def test_text_is_an_indented_tree_in_the_line_format():
    small_run()
    with ci.scope("still-running"):
        text = ci.trace()
    lines = text.splitlines()
    assert lines[0] == "cirron.session - open (running)"
    assert lines[1].startswith("  epoch[0] - ") and lines[1].endswith("{epoch_loss=0.5}")
    assert lines[2].startswith("    batch[0] - ") and lines[2].endswith("{loss=1}")
    assert lines[3].startswith("      forward - ")
    assert lines[-1] == "  still-running - open (running)"
    assert repr(text) == str(text)  # a notebook shows the tree, not a quoted string


def test_dict_nodes_have_every_field():
    small_run()
    root = ci.trace(format="dict")
    epoch = root["children"][0]
    assert set(epoch) >= {
        "name",
        "index",
        "span_id",
        "parent_id",
        "start_ns",
        "end_ns",
        "duration_ns",
        "attributes",
        "marks",
        "children",
    }
    assert epoch["duration_ns"] == epoch["end_ns"] - epoch["start_ns"]
    assert [c["index"] for c in epoch["children"]] == [0, 1, 2]


def test_json_is_the_dict_as_a_string():
    small_run()
    assert json.loads(ci.trace(format="json")) == json.loads(json.dumps(ci.trace(format="dict")))


def test_name_filter_keeps_subtrees():
    small_run()
    batches = ci.trace(format="dict", name="batch")
    assert len(batches) == 6
    assert all([c["name"] for c in b["children"]] == ["forward"] for b in batches)
    assert ci.trace(name="batch").count("forward") == 6


def test_last_keeps_the_most_recently_closed_spans():
    small_run()
    last = ci.trace(format="dict", last=2)
    assert [n["name"] for n in last] == ["batch", "epoch"]
    assert last[1]["index"] == 1
    assert ci.trace(format="dict", name="forward", last=1)[0]["name"] == "forward"
    assert ci.trace(format="dict", last=0) == []


def test_dataframe_has_one_row_per_span_with_depth():
    pytest.importorskip("pandas")
    small_run()
    frame = ci.trace(format="df")
    assert len(frame) == 1 + 2 + 6 + 6
    assert {
        "name",
        "index",
        "span_id",
        "parent_id",
        "depth",
        "start_ns",
        "end_ns",
        "duration_ns",
    } <= set(frame.columns)
    assert frame.groupby("name")["depth"].first().to_dict() == {
        "cirron.session": 0,
        "epoch": 1,
        "batch": 2,
        "forward": 3,
    }


def test_dataframe_without_pandas_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        ci.trace(format="df")


def test_bad_arguments():
    with pytest.raises(ValueError, match="format"):
        ci.trace(format="yaml")
    with pytest.raises(ValueError, match="last"):
        ci.trace(last=-1)


def test_the_store_is_bounded_and_says_when_it_evicted():
    ci.profile(output="none", config={"trace_buffer": 10})
    for i in range(25):
        with ci.scope("s", index=i):
            pass
    assert ci.health()["trace_evicted"] == 15
    assert ci.trace().splitlines()[0].startswith("(15 older spans were evicted")
    assert [n["index"] for n in ci.trace(format="dict", name="s")] == list(range(15, 25))


def test_trace_without_profile_writes_nothing(tmp_path):
    with ci.scope("notebook-cell"):
        ci.mark("x", 1)
    assert "notebook-cell" in ci.trace()
    assert list(tmp_path.iterdir()) == []


def test_a_table_filtered_by_name_holds_the_rows_of_that_name():
    pytest.importorskip("pandas")
    for _ in ci.epochs(range(2)):
        for _ in ci.batches(range(3)):
            ci.mark("loss", 0.5)
    frame = ci.trace(format="df", name="batch")
    assert list(frame["name"]) == ["batch"] * 6
    assert set(frame["depth"]) == {2}  # their depth in the tree: session, epoch, batch
    whole = ci.trace(format="df")
    assert len(whole) == 1 + 2 + 6


def test_in_a_notebook_the_trace_is_a_collapsible_tree():
    for _ in ci.epochs(range(1)):
        with ci.scope("a <b> & c"):
            ci.mark("loss", 0.5)
    html = ci.trace()._repr_html_()
    assert html.count("<details") == 2  # the session and the epoch have children; the scope not
    assert "a &lt;b&gt; &amp; c" in html and "{loss=0.5}" in html
    assert str(ci.trace()).splitlines()[0].startswith("cirron.session")


def test_in_a_notebook_the_findings_come_above_the_tree():
    """The same findings as `cirron show --diagnose`: a loop that mostly waits for its data."""
    import time

    import torch

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, index):
            time.sleep(0.005)
            return torch.ones(2), torch.ones(1)

    ci.profile(output="none")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in torch.utils.data.DataLoader(Slow(), batch_size=2):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    html = ci.trace()._repr_html_()
    findings, tree = html.split('<div style="font-family: monospace', 1)
    assert "<b>warning</b>" in findings and "the run is input-bound" in findings
    assert "num_workers" in findings
    assert "step[0]" in tree
