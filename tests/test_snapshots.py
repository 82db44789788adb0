"""Snapshots of watched torch models at epoch boundaries, as a user's training script sees them.

Spans are read back from the spool (OTLP/JSON), where the tensor events are.
"""

from __future__ import annotations

import ast
import logging
import math
import os
import random
import subprocess
import sys
import textwrap

import pytest

import cirron as ci
from support import run_python

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Net(nn.Module):
    def __init__(self, dtype=torch.float32) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.out = nn.Linear(8, 2, dtype=dtype)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)).to(self.out.weight.dtype)).float()


def loader(samples=12):
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(samples, 4, generator=generator)), batch_size=4)


def train(models, epochs=2, after_epoch=None):
    """A plain loop over a DataLoader (the torch hooks make the epochs)."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    data = loader()
    for epoch in range(epochs):
        for (x,) in data:
            for model, optimizer in zip(models, optimizers, strict=True):
                optimizer.zero_grad()
                model(x).pow(2).mean().backward()
                optimizer.step()
        if after_epoch is not None:
            after_epoch(epoch)


def copies(model):
    """The parameters and gradients as they are now."""
    return {
        "weight": {n: p.detach().clone() for n, p in model.named_parameters()},
        "gradient": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
    }


# -- reading the spool -----------------------------------------------------------------
def plain(value):
    ((kind, inner),) = value.items()
    if kind == "intValue":
        return int(inner)
    if kind == "doubleValue":
        return float(inner)
    if kind == "arrayValue":
        return [plain(item) for item in inner.get("values", [])]
    return inner


def attributes(items):
    return {item["key"]: plain(item["value"]) for item in items}


def finished_spans(name):
    ci.shutdown()
    return [s for s in ci.spool_spans(".cirron") if s["name"] == name]


def by_start(spans):
    return sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))


def events(span):
    return [(e["name"], attributes(e["attributes"])) for e in span["events"]]


# -- the span ------------------------------------------------------------------------
def test_two_epochs_give_two_snapshots_each_a_child_of_its_epoch_with_a_link_to_it():
    ci.profile()
    model = Net()
    ci.watch(model)
    taken = []
    train([model], after_epoch=lambda _: taken.append(copies(model)))

    epochs = by_start(finished_spans("epoch"))
    snapshots = by_start(finished_spans("snapshot"))
    assert len(epochs) == len(snapshots) == 2
    for epoch, snapshot, expected in zip(epochs, snapshots, taken, strict=True):
        assert snapshot["parentSpanId"] == epoch["spanId"]
        assert [link["spanId"] for link in snapshot["links"]] == [epoch["spanId"]]
        assert attributes(snapshot["attributes"]) == {
            "snapshot.mode": "stats",
            "snapshot.model": "Net",
            "snapshot.tensors": 8,
        }
        records = events(snapshot)
        assert [(name, a["kind"]) for name, a in records] == [
            (name, kind)
            for name in ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
            for kind in ("weight", "gradient")
        ]
        for name, record in records:
            tensor = expected[record["kind"]][name]
            assert record["dtype"] == "float32" and record["shape"] == list(tensor.shape)
            assert record["mean"] == pytest.approx(tensor.mean().item(), abs=1e-6)
            assert record["max"] == tensor.max().item() and record["min"] == tensor.min().item()
            assert record["norm"] == pytest.approx(tensor.norm().item(), rel=1e-5)
            assert sum(record["histogram"]) == tensor.numel() and len(record["histogram"]) == 16
            assert (record["nan_count"], record["inf_count"]) == (0, 0)
    assert not os.path.exists(".cirron/snapshots")  # stats: no files


def test_ci_trace_shows_the_snapshot_with_its_tensor_events_and_link():
    ci.profile(output="none")
    model = Net()
    ci.watch(model)
    train([model], epochs=1)
    ci.shutdown()

    (epoch,) = ci.trace(format="dict", name="epoch")
    (snapshot,) = [child for child in epoch["children"] if child["name"] == "snapshot"]
    assert snapshot["links"] == [
        {"trace_id": snapshot["links"][0]["trace_id"], "span_id": epoch["span_id"]}
    ]
    assert snapshot["marks"] == []  # tensor records are events, not marks
    assert [(e["name"], e["attributes"]["kind"]) for e in snapshot["events"]] == [
        (name, kind)
        for name in ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
        for kind in ("weight", "gradient")
    ]
    weight = snapshot["events"][0]["attributes"]
    assert weight["shape"] == [8, 4] and len(weight["histogram"]) == 16
    assert weight["mean"] == pytest.approx(model.hidden.weight.mean().item(), abs=1e-6)
    frame = ci.trace(format="df", name="snapshot")
    assert len(frame.loc[0, "events"]) == 8


def test_ci_epochs_boundaries_are_snapshotted_without_any_hooks():
    ci.profile(frameworks=[])
    model = Net()
    ci.watch(model, name="policy")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in ci.epochs(range(3)):
        for (x,) in loader():
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()

    snapshots = finished_spans("snapshot")
    epoch_ids = {e["spanId"] for e in finished_spans("epoch")}
    assert len(snapshots) == 3
    assert {s["parentSpanId"] for s in snapshots} == epoch_ids
    assert {attributes(s["attributes"])["snapshot.model"] for s in snapshots} == {"policy"}


def test_one_epoch_seen_by_ci_epochs_and_the_hooks_gets_one_snapshot():
    ci.profile()
    model = Net()
    ci.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = loader()
    for _ in ci.epochs(range(2)):
        for (x,) in data:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    epochs = finished_spans("epoch")
    assert len(epochs) == 2
    assert sorted(s["parentSpanId"] for s in finished_spans("snapshot")) == sorted(
        e["spanId"] for e in epochs
    )


def test_no_tensor_is_lost_to_the_event_limit():
    ci.profile(config={"max_events": 3})
    model = nn.Sequential(nn.Linear(4, 2), *[nn.Linear(2, 2) for _ in range(4)])
    ci.watch(model)
    train([model], epochs=1)
    (snapshot,) = finished_spans("snapshot")
    assert len(snapshot["events"]) == 20 and snapshot.get("droppedEventsCount", 0) == 0
    assert ci.health()["marks_dropped"] == 0


def test_frozen_and_unused_parameters_have_a_weight_record_and_no_gradient():
    ci.profile()
    model = Net()
    model.hidden.requires_grad_(False)
    model.spare = nn.Linear(3, 3)  # never called: no gradient
    ci.watch(model)
    train([model], epochs=1)
    (snapshot,) = finished_spans("snapshot")
    kinds = [(name, a["kind"]) for name, a in events(snapshot)]
    assert ("hidden.weight", "weight") in kinds and ("spare.bias", "weight") in kinds
    assert not [name for name, kind in kinds if kind == "gradient" and "out." not in name]


def test_nan_and_inf_weights_still_get_a_record():
    ci.profile()
    model = Net()
    with torch.no_grad():
        model.out.bias[0] = float("nan")
        model.hidden.weight[0, 0] = float("inf")
    ci.watch(model)
    for _ in ci.epochs(range(1)):
        pass
    (snapshot,) = finished_spans("snapshot")
    records = dict((name, a) for name, a in events(snapshot) if a["kind"] == "weight")
    assert records["out.bias"]["nan_count"] == 1 and math.isfinite(records["out.bias"]["max"])
    assert records["hidden.weight"]["inf_count"] == 1
    assert ci.health()["hook_errors"] == 0


def test_sparse_gradients_and_integer_and_meta_parameters_are_described():
    ci.profile()
    model = nn.Module()
    model.embedding = nn.Embedding(10, 3, sparse=True)
    model.steps = nn.Parameter(torch.arange(6), requires_grad=False)
    ci.watch(model)
    ghost = nn.Linear(2, 2, device="meta")
    ci.watch(ghost)
    optimizer = torch.optim.SGD(model.embedding.parameters(), lr=0.1)
    for _ in ci.epochs(range(1)):
        model.embedding(torch.tensor([1, 2, 2])).sum().backward()
        optimizer.step()
    snapshots = {
        attributes(s["attributes"])["snapshot.model"]: s for s in finished_spans("snapshot")
    }
    records = {(name, a["kind"]): a for name, a in events(snapshots["Module"])}
    gradient = records[("embedding.weight", "gradient")]
    assert gradient["shape"] == [10, 3] and gradient["max"] == 2.0 and gradient["min"] == 0.0
    assert records[("steps", "weight")]["dtype"] == "int64"
    assert records[("steps", "weight")]["mean"] == 2.5
    meta = {name: a for name, a in events(snapshots["Linear"])}
    assert meta["weight"]["shape"] == [2, 2] and math.isnan(meta["weight"]["mean"])
    assert ci.health()["hook_errors"] == 0


def test_two_watched_models_each_get_their_own_snapshot_per_epoch():
    ci.profile()
    generator, discriminator = Net(), nn.Sequential(nn.Linear(4, 1))
    ci.watch(generator, name="generator")
    ci.watch(discriminator, name="discriminator")
    train([generator, discriminator])
    snapshots = finished_spans("snapshot")
    by_model = {}
    for snapshot in snapshots:
        by_model.setdefault(attributes(snapshot["attributes"])["snapshot.model"], []).append(
            snapshot
        )
    assert {name: len(spans) for name, spans in by_model.items()} == {
        "generator": 2,
        "discriminator": 2,
    }
    assert {name for name, _ in events(by_model["discriminator"][0])} == {"0.weight", "0.bias"}


# -- short epochs --------------------------------------------------------------------
def test_a_small_model_is_snapshotted_at_every_one_of_many_back_to_back_epochs():
    ci.profile(frameworks=[])
    model = Net()
    ci.watch(model)
    for _ in ci.epochs(range(30)):
        model(torch.randn(2, 4)).sum().backward()
    assert len(finished_spans("snapshot")) == 30
    assert ci.health()["snapshots_skipped"] == 0


def test_a_model_still_being_snapshotted_is_skipped_not_waited_for(caplog):
    # 25M parameters with their gradients: the background work of one snapshot takes far
    # longer than these epochs (which do nothing), so most boundaries find it in flight.
    ci.profile(frameworks=[])
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(24)])
    model(torch.randn(1, 1024)).sum().backward()
    ci.watch(model, name="big")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        for _ in ci.epochs(range(6)):
            pass
        skipped = ci.health()["snapshots_skipped"]
    spans = finished_spans("snapshot") + finished_spans("epoch")
    epochs = sorted(
        (s for s in spans if s["name"] == "epoch"), key=lambda s: int(s["startTimeUnixNano"])
    )
    snapshotted = {s["parentSpanId"] for s in spans if s["name"] == "snapshot"}
    for epoch in epochs:  # each boundary has its snapshot, or says it skipped it
        said = attributes(epoch["attributes"]).get("snapshot.skipped")
        assert (epoch["spanId"] in snapshotted) != (said == ["big"]), epoch
    assert epochs[0]["spanId"] in snapshotted  # nothing was in flight at the first
    assert 1 <= skipped == sum(e["spanId"] not in snapshotted for e in epochs)
    (warning,) = [r.getMessage() for r in caplog.records if "'big'" in r.getMessage()]
    assert "snapshots_skipped" in warning


# -- raw tensors -----------------------------------------------------------------------
def load(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as file:
        return {key: file.get_tensor(key) for key in file.keys()}, file.metadata()


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_raw_tensors_load_back_equal_to_the_parameters_at_that_epoch(mode):
    ci.profile(snapshots=mode, sample_rate=1.0)
    model = Net(dtype=torch.bfloat16)
    ci.watch(model)
    taken = []
    train([model], after_epoch=lambda _: taken.append(copies(model)))

    snapshots = by_start(finished_spans("snapshot"))
    assert len(snapshots) == 2
    for index, (snapshot, expected) in enumerate(zip(snapshots, taken, strict=True)):
        found = attributes(snapshot["attributes"])
        directory = os.path.join(os.path.abspath(".cirron"), "snapshots", snapshot["spanId"])
        assert found["snapshot.weights_path"] == os.path.join(directory, "weights.safetensors")
        assert found["snapshot.gradients_path"] == os.path.join(directory, "gradients.safetensors")
        assert sorted(os.listdir(directory)) == ["gradients.safetensors", "weights.safetensors"]
        for kind, attribute in (("weight", "weights_path"), ("gradient", "gradients_path")):
            tensors, metadata = load(found[f"snapshot.{attribute}"])
            assert metadata == {
                "model": "Net",
                "epoch": str(index),
                "step": str(3 * index + 3),
                "kind": kind,
            }
            assert tensors.keys() == expected[kind].keys()
            for name, tensor in tensors.items():
                assert tensor.dtype == expected[kind][name].dtype
                assert torch.equal(tensor, expected[kind][name]), name
    assert tensors["out.weight"].dtype == torch.bfloat16


def test_a_model_of_many_megabytes_is_copied_exactly():
    # Copied in chunks by two threads: each byte must land where it belongs.
    ci.profile(snapshots="full", frameworks=[])
    model = nn.Sequential(nn.Linear(1500, 1500), nn.Linear(1500, 3, dtype=torch.float64))
    ci.watch(model)
    for _ in ci.epochs(range(1)):
        model[1](model[0](torch.randn(2, 1500)).double()).sum().backward()
        expected = copies(model)
    (snapshot,) = finished_spans("snapshot")
    found = attributes(snapshot["attributes"])
    for kind, attribute in (("weight", "weights_path"), ("gradient", "gradients_path")):
        tensors, _ = load(found[f"snapshot.{attribute}"])
        assert all(torch.equal(tensors[n], expected[kind][n]) for n in expected[kind])
    weight = {name: a for name, a in events(snapshot) if a["kind"] == "weight"}["0.weight"]
    assert weight["max"] == expected["weight"]["0.weight"].max().item()


def test_snapshot_files_are_never_writable_by_others_whatever_the_umask():
    previous = os.umask(0)
    try:
        ci.profile(snapshots="full", frameworks=[])
        model = nn.Linear(2, 2)
        ci.watch(model)
        for _ in ci.epochs(range(1)):
            model(torch.ones(1, 2)).sum().backward()
        (snapshot,) = finished_spans("snapshot")
    finally:
        os.umask(previous)
    path = attributes(snapshot["attributes"])["snapshot.weights_path"]
    assert os.stat(path).st_mode & 0o777 == 0o664
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o775


def test_sample_rate_zero_writes_no_file_but_still_records_the_stats():
    ci.profile(snapshots="sampled", sample_rate=0.0)
    model = Net()
    ci.watch(model)
    train([model])
    snapshots = finished_spans("snapshot")
    assert len(snapshots) == 2 and all(len(s["events"]) == 8 for s in snapshots)
    assert all("snapshot.weights_path" not in attributes(s["attributes"]) for s in snapshots)
    assert not os.path.exists(".cirron/snapshots")


def sampled_epochs(seed):
    """The indexes of the epochs whose snapshot wrote files, in a run seeded with ``seed``."""
    random.seed(seed)
    ci.profile(snapshots="sampled", sample_rate=0.5, frameworks=[])
    model = nn.Linear(2, 2)
    ci.watch(model)
    for _ in ci.epochs(range(12)):
        pass
    spans = finished_spans("snapshot") + finished_spans("epoch")
    index = {s["spanId"]: attributes(s["attributes"]).get("index") for s in spans}
    return sorted(
        index[s["parentSpanId"]]
        for s in spans
        if s["name"] == "snapshot" and "snapshot.weights_path" in attributes(s["attributes"])
    )


def test_seeding_random_makes_the_sampled_epochs_reproducible(tmp_path, monkeypatch):
    first = sampled_epochs(seed=11)
    (tmp_path / "again").mkdir()
    monkeypatch.chdir(tmp_path / "again")
    assert sampled_epochs(seed=11) == first and 0 < len(first) < 12


SEEDED = """
    import random, sys, torch
    import cirron as ci
    random.seed(7)
    if sys.argv[1] == "on":
        ci.profile(snapshots="sampled", sample_rate=0.5, frameworks=["torch"])
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ci.watch(model) if sys.argv[1] == "on" else None
    for epoch in ci.epochs(range(10)):  # the metrics sink measures each batch meanwhile
        for batch in ci.batches(range(2)):
            random.random()
            optimizer.zero_grad()
            loss = model(torch.ones(4, 2)).pow(2).mean()
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss)
    ci.shutdown()
    spans = ci.spool_spans()
    epochs = {s["spanId"]: s["attributes"][0]["value"]["intValue"] for s in spans
              if s["name"] == "epoch"}
    print(sorted(int(epochs[s["parentSpanId"]]) for s in spans if s["name"] == "snapshot"
                 and any(a["key"] == "snapshot.weights_path" for a in s["attributes"])))
    print(random.random())
"""


def test_a_seeded_run_samples_the_same_epochs_in_every_process_and_draws_as_without_cirron(
    tmp_path,
):
    outputs = []
    for run, mode in enumerate(["on", "on", "off"]):
        (tmp_path / str(run)).mkdir()
        script = tmp_path / str(run) / "seeded.py"
        script.write_text(textwrap.dedent(SEEDED))
        result = subprocess.run(
            [sys.executable, str(script), mode], cwd=script.parent, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout.splitlines())
    first, second, without = outputs
    assert first == second  # the same epochs sampled, in two processes
    assert 0 < len(ast.literal_eval(first[0])) < 10
    assert first[1] == without[1]  # the program's own random numbers, as without cirron


def test_an_unwritable_snapshot_directory_loses_the_files_with_one_warning(caplog):
    os.makedirs(".cirron")
    with open(".cirron/snapshots", "w") as blocker:  # a file where the directory should be
        blocker.write("not a directory")
    profiler = ci.profile(snapshots="full")
    model = Net()
    ci.watch(model)
    with caplog.at_level(logging.WARNING, logger="cirron"):
        train([model])
    snapshots = finished_spans("snapshot")
    assert len(snapshots) == 2 and all(len(s["events"]) == 8 for s in snapshots)
    assert all("snapshot.weights_path" not in attributes(s["attributes"]) for s in snapshots)
    assert profiler.health()["snapshot_files_lost"] == 4  # 2 epochs, weights and gradients
    assert len([r for r in caplog.records if "snapshot file" in r.getMessage()]) == 1


def test_a_stats_run_needs_no_safetensors_and_a_sampled_one_counts_what_it_lost(tmp_path):
    completed = run_python(
        """
        import sys
        sys.modules["safetensors"] = None  # as if it were not installed
        import torch, cirron as ci
        from torch import nn
        for mode in ("stats", "full"):
            profiler = ci.profile(snapshots=mode, output="none")
            model = nn.Linear(2, 2)
            ci.watch(model)
            for _ in ci.epochs(range(2)):
                model(torch.ones(1, 2)).sum().backward()
            ci.flush()
            health = profiler.health()
            print(mode, health["snapshot_files_lost"], health["hook_errors"])
            ci.shutdown()
        """,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split("\n")[:2] == ["stats 0 0", "full 4 0"]
    assert "could not write snapshot file" in completed.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_model_on_a_gpu_is_summarised_on_the_device_and_its_raw_tensors_come_back():
    ci.profile(snapshots="full")
    model = Net().cuda()
    ci.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    taken = []
    for _ in ci.epochs(range(2)):
        for (x,) in loader():
            optimizer.zero_grad()
            model(x.cuda()).pow(2).mean().backward()
            optimizer.step()
        taken.append(
            {kind: {n: t.cpu() for n, t in c.items()} for kind, c in copies(model).items()}
        )
    for snapshot, expected in zip(by_start(finished_spans("snapshot")), taken, strict=True):
        found = attributes(snapshot["attributes"])
        tensors, _ = load(found["snapshot.weights_path"])
        assert all(torch.equal(tensors[n], expected["weight"][n]) for n in tensors)
        for name, record in events(snapshot):
            tensor = expected[record["kind"]][name]
            assert record["mean"] == pytest.approx(tensor.mean().item(), abs=1e-6)
            assert record["max"] == tensor.max().item()


def test_on_a_provider_with_its_own_sampler_the_snapshot_is_an_sdk_span_with_every_event(
    tmp_path,
):
    completed = run_python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
        provider = TracerProvider(sampler=TraceIdRatioBased(1.0))
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        import torch, cirron as ci
        from torch import nn
        ci.profile(output="none", config={"max_events": 2})
        model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        ci.watch(model)
        for _ in ci.epochs(range(1)):
            model(torch.ones(1, 2)).sum().backward()
        ci.shutdown()
        spans = {s.name: s for s in exporter.get_finished_spans()}
        snapshot, epoch = spans["snapshot"], spans["epoch"]
        print(type(snapshot).__module__, len(snapshot.events), snapshot.dropped_events,
              snapshot.parent.span_id == epoch.context.span_id,
              [link.context.span_id for link in snapshot.links] == [epoch.context.span_id])
        """,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["opentelemetry.sdk.trace", "8", "0", "True", "True"]
