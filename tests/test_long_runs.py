"""Long runs stay viewable: past ``trace_split`` spans, each later epoch is a trace of its own."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

import cirron as ci
from cirron.exporters import spool_spans


def train(epochs: int, batches: int) -> None:
    for _ in ci.epochs(range(epochs)):
        for _ in ci.batches(range(batches)):
            ci.mark("loss", 0.5)
        with ci.scope("eval"):
            pass


def epoch_traces(path: str) -> dict[int, str]:
    found = {}
    for span in spool_spans(path):
        if span["name"] == "epoch":
            (index,) = [a["value"]["intValue"] for a in span["attributes"] if a["key"] == "index"]
            found[int(index)] = span["traceId"]
    return found


def test_the_hook_spans_not_built_yet_count_toward_the_limit(tmp_path):
    import torch

    ci.profile(path=str(tmp_path), config={"trace_split": 60}, flush_interval=60)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(80, 4), torch.randn(80, 1))
    for _epoch in range(6):  # 27 spans an epoch: 5 steps of 5 spans, the dry fetch, the epoch
        for x, y in torch.utils.data.DataLoader(data, batch_size=16):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
    ci.shutdown()
    (session,) = [s for s in spool_spans(str(tmp_path)) if s["name"] == "cirron.session"]
    traces = epoch_traces(str(tmp_path))
    # 1 + 27 * 3 = 82 spans recorded before epoch 3: past 60 (built or still noted)
    assert [traces[i] == session["traceId"] for i in range(6)] == [True] * 3 + [False] * 3


def test_past_the_limit_each_epoch_begins_a_trace_linked_to_its_parent(tmp_path):
    ci.profile(path=str(tmp_path), config={"trace_split": 50})
    train(epochs=5, batches=20)
    ci.shutdown()  # the session span too
    spans = spool_spans(str(tmp_path))
    (session,) = [s for s in spans if s["name"] == "cirron.session"]
    traces = epoch_traces(str(tmp_path))
    # 1 session + 22 spans an epoch (the epoch, 20 batches, eval): the limit is passed in epoch 2
    assert [traces[i] == session["traceId"] for i in range(5)] == [True] * 3 + [False] * 2
    assert traces[3] != traces[4]
    by_trace = Counter(s["traceId"] for s in spans)
    assert by_trace[traces[3]] == by_trace[traces[4]] == 22  # the epoch and what is inside it
    for epoch in (s for s in spans if s["name"] == "epoch" and s["traceId"] != session["traceId"]):
        assert not epoch.get("parentSpanId")
        assert [(link["traceId"], link["spanId"]) for link in epoch["links"]] == [
            (session["traceId"], session["spanId"])
        ]
        assert {"key": "cirron.parent_span_id", "value": {"stringValue": session["spanId"]}} in (
            epoch["attributes"]
        )
    # ci.trace() shows one tree all the same (also after shutdown)
    tree = ci.trace(format="dict")
    assert [(c["name"], c["index"]) for c in tree["children"] if c["name"] == "epoch"] == [
        ("epoch", i) for i in range(5)
    ]
    assert all(len(c["children"]) == 21 for c in tree["children"] if c["name"] == "epoch")


def test_the_same_epoch_of_every_rank_shares_its_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("CIRRON_RUN_ID", "long-run-7")
    found = []
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        ci.profile(path=str(tmp_path / rank), config={"trace_split": 30})
        train(epochs=4, batches=20)
        ci.shutdown()
        found.append(epoch_traces(str(tmp_path / rank)))
    assert found[0] == found[1]
    assert len(set(found[0].values())) == 3  # epochs 0-1 with the session, then 2 and 3 alone


@pytest.mark.slow
def test_a_20k_step_run_gives_bounded_traces_and_one_tree(tmp_path):
    # A buffer that holds the whole burst: what is checked is how the run splits, not
    # whether the spool keeps up with an empty loop on a busy machine.
    settings = {"trace_split": 2000, "trace_buffer": 30000, "buffer_size": 65536}
    ci.profile(path=str(tmp_path), config=settings)
    train(epochs=20, batches=1000)
    ci.shutdown()
    spans = spool_spans(str(tmp_path))
    per_trace = Counter(s["traceId"] for s in spans)
    assert len(per_trace) == 19  # the session's (epochs 0 and 1), then one per later epoch
    assert max(per_trace.values()) <= 2 * 1002 + 1  # at most the session's first two epochs
    ids = {s["spanId"] for s in spans}
    for span in spans:  # every link points at a span of the run
        for link in span.get("links", []):
            assert link["spanId"] in ids
    tree = ci.trace(format="dict")
    epochs = [c for c in tree["children"] if c["name"] == "epoch"]
    assert [e["index"] for e in epochs] == list(range(20))
    assert sum(len(kids) for kids in (e["children"] for e in epochs)) == 20 * 1001


def test_zero_never_splits_and_a_bad_value_warns(tmp_path, monkeypatch, caplog):
    ci.profile(path=str(tmp_path), config={"trace_split": 0})
    train(epochs=3, batches=30)
    ci.shutdown()
    assert len(set(epoch_traces(str(tmp_path)).values())) == 1
    monkeypatch.setenv("CIRRON_TRACE_SPLIT", "-5")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        assert ci.profile(output="none").recorder.settings.trace_split == 10000
    assert any("CIRRON_TRACE_SPLIT" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="trace_split"):
        ci.profile(config={"trace_split": -1})


def test_step_sampling_keeps_every_step_but_the_hook_spans_of_some(tmp_path):
    torch = pytest.importorskip("torch")
    ci.profile(output="none", config={"step_sampling": (2, 3)})
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    for _ in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss)
    epochs = ci.trace(format="dict", name="epoch")
    assert len(epochs) == 2
    for epoch in epochs:
        steps = [c for c in epoch["children"] if c["name"] == "step"]
        assert len(steps) == 10  # every step is kept, with its marks
        detailed = [i for i, s in enumerate(steps) if s["children"]]
        assert detailed == [0, 1, 2, 5, 8]  # the first 2, then every 3rd
        for position, step in enumerate(steps):
            assert [m["name"] for m in step["marks"]] == ["loss"]
            assert step["attributes"].get("detail", True) is (position in detailed)
        full = {c["name"] for c in steps[0]["children"]}
        assert {"data_load", "forward", "backward", "optimizer_step"} <= full


def test_step_sampling_is_off_by_default_and_checked(monkeypatch, caplog):
    assert ci.profile(output="none").recorder.settings.step_sampling is None
    ci.shutdown()
    monkeypatch.setenv("CIRRON_STEP_SAMPLING", "100,10")
    assert ci.profile(output="none").recorder.settings.step_sampling == (100, 10)
    ci.shutdown()
    monkeypatch.setenv("CIRRON_STEP_SAMPLING", "many")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        assert ci.profile(output="none").recorder.settings.step_sampling is None
    assert any("CIRRON_STEP_SAMPLING" in r.getMessage() for r in caplog.records)
    ci.shutdown()
    with pytest.raises(ValueError, match="step_sampling"):
        ci.profile(config={"step_sampling": (5, 0)})
