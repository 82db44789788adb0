"""GPU time (``gpu_ns``) from CUDA event pairs, resolved off the training thread.

No GPU exists on the machines that run this suite, so the CUDA event API is
stood in for by a fake that behaves like one (an event completes some time
after it is recorded); on a machine with a GPU the real path runs in
``test_gpu_time_on_a_real_gpu``.
"""

from __future__ import annotations

import itertools

import pytest

import cirron as ci
from cirron.instrumentors import torch_memory
from cirron.recording.scopes import Scope

torch = pytest.importorskip("torch")


def spool_attributes(name):
    spans = [s for s in ci.spool_spans() if s["name"] == name]
    return [{a["key"]: a["value"] for a in s["attributes"]} for s in spans]


def test_deferred_attribute_waits_until_it_is_known():
    ci.profile(output="spool")
    answers = iter([None, None, 1234])
    with Scope("kernel", {}) as scope:
        span = scope.span
    span.defer_attribute("gpu_ns", lambda final: next(answers))
    processor = ci.profiler.current().recorder.processor
    processor._drain()  # not known yet: held back
    processor._drain()
    assert [s.name for s in processor._waiting] == ["kernel"]
    ci.flush()
    assert spool_attributes("kernel") == [{"gpu_ns": {"intValue": "1234"}}]


def test_an_attribute_never_known_is_left_out_at_flush():
    ci.profile(output="spool")
    with Scope("kernel", {}) as scope:
        span = scope.span
    span.defer_attribute("gpu_ns", lambda final: None)
    ci.flush()
    assert spool_attributes("kernel") == [{}]


class FakeEvent:
    """Stands in for torch.cuda.Event: done one query after it was recorded."""

    synchronized = 0  # calls of synchronize(), across events

    clock = itertools.count(0, 1_000_000)  # ns between records

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.time_ns = None
        self.queries = 0

    def record(self, stream=None):
        self.time_ns = next(self.clock)

    def query(self):
        self.queries += 1
        return self.queries > 1

    def synchronize(self):
        FakeEvent.synchronized += 1
        self.queries = 1

    def elapsed_time(self, end):
        return (end.time_ns - self.time_ns) / 1e6  # milliseconds, like CUDA


def train_a_few_steps():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()


def test_cuda_scopes_get_gpu_ns_without_waiting_on_the_stream(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "_initialized", True)  # what is_initialized() reads first
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    # The per-step memory probe reads the allocator: a CUDA that is only pretended has none.
    monkeypatch.setattr(torch_memory, "cuda_peaks", lambda: {})
    ci.profile(output="spool", frameworks=["torch"])
    FakeEvent.synchronized = 0
    train_a_few_steps()
    assert FakeEvent.synchronized == 0  # training never waited on the GPU
    ci.flush()
    for name in ("forward", "backward", "optimizer_step"):
        values = [a["gpu_ns"]["intValue"] for a in spool_attributes(name)]
        assert len(values) == 2 and all(int(v) > 0 for v in values), name


def test_cpu_runs_have_no_gpu_ns_attribute_at_all():
    ci.profile(output="spool", frameworks=["torch"])
    train_a_few_steps()
    ci.flush()
    for name in ("forward", "backward", "optimizer_step"):
        assert all("gpu_ns" not in a for a in spool_attributes(name))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_gpu_time_on_a_real_gpu():
    ci.profile(output="spool", frameworks=["torch"])
    model = torch.nn.Linear(256, 256).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        optimizer.step()
    torch.cuda.synchronize()
    ci.flush()
    for name in ("forward", "backward", "optimizer_step"):
        assert all(int(a["gpu_ns"]["intValue"]) > 0 for a in spool_attributes(name)), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_a_loss_marked_on_the_gpu_is_read_without_waiting_and_recorded_exactly():
    ci.profile(output="spool", frameworks=["torch"])
    model = torch.nn.Linear(256, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = model(torch.randn(64, 256, device="cuda")).pow(2).mean()
        loss.backward()
        optimizer.step()
        ci.mark("loss", loss.detach().view(1))  # a [1]-shaped CUDA tensor
        losses.append(loss.item())
    ci.shutdown()  # the last step ends with the run (a step ends where the next one begins)
    steps = [s for s in ci.spool_spans() if s["name"] == "step"]
    marked = [e["attributes"][0]["value"]["doubleValue"] for s in steps for e in s["events"]]
    assert marked == pytest.approx(losses)
