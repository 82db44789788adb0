"""``collective`` spans of the collectives a program calls, and of DDP buckets reduced by a hook of
the program's, each in a fresh interpreter on a one-rank gloo group (no network, no torchrun).

The two-and-three-rank runs (DDP's own reduction, the wait for a slow rank, gradients bit for
bit) are in tests/test_ranks.py.
"""

from __future__ import annotations

import json

import pytest

from support import run_python

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

ONE_RANK = """
import json, torch, torch.distributed as dist
import cirron as ci

ci.profile(output="none", frameworks=["torch"])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def collectives(node, found):
    if node["name"] == "collective":
        found.append(node)
    for child in node["children"]:
        collectives(child, found)
    return found


def report(**extra):
    found = collectives(ci.trace(format="dict"), [])
    print(json.dumps({"spans": [{"attributes": n["attributes"], "status": n["status"],
                                 "duration_ns": n["end_ns"] - n["start_ns"]} for n in found],
                      "health": ci.health(), **extra}))
"""


def run(code: str) -> dict:
    result = run_python(ONE_RANK + code, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_each_collective_the_program_calls_is_a_span_with_its_op_bytes_and_group():
    found = run("""
t = torch.ones(4)
with ci.scope("sync"):
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.all_gather([torch.zeros(4)], t)
    dist.all_gather_into_tensor(torch.zeros(4), t)
    dist.barrier()
    dist.all_reduce(t, async_op=True).wait()
report()
""")
    spans = found["spans"]
    ops = [span["attributes"]["collective.op"] for span in spans]
    assert ops == ["all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "barrier",
                   "all_reduce"]  # fmt: skip
    assert [span["attributes"]["collective.bytes"] for span in spans] == [16, 16, 16, 16, 0, 16]
    for span in spans:
        assert span["attributes"]["collective.group_size"] == 1
        assert span["attributes"]["collective.backend"] == "gloo"
        assert "collective.bucket" not in span["attributes"]


def test_a_collective_that_raises_is_an_error_span_and_the_error_reaches_the_program():
    found = run("""
try:
    dist.broadcast(torch.ones(2), src=3)  # no rank 3 in a group of one
except RuntimeError as error:
    caught = str(error)
report(caught=caught)
""")
    (span,) = found["spans"]
    assert span["status"] == "ERROR" and span["attributes"]["collective.op"] == "broadcast"
    assert "invalid root rank: 3" in found["caught"]  # the program's own exception, unchanged
    assert found["health"]["hook_errors"] == 0


def test_a_failure_inside_cirron_leaves_the_collective_alone():
    found = run("""
from cirron.instrumentors import torch_collectives

def broken(group):
    raise RuntimeError("inside cirron")

torch_collectives.group_facts = broken
t = torch.ones(3)
dist.all_reduce(t)
report(value=t.tolist())
""")
    assert found["value"] == [1.0, 1.0, 1.0]
    assert found["spans"] == []
    assert found["health"]["hook_errors"] == 1


def test_a_ddp_hook_of_the_programs_is_wrapped_and_gives_the_same_gradients():
    found = run("""
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


def train():
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    model.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        optimizer.step()
    return [p.detach().tolist() for p in model.parameters()]


with_cirron = train()
spans = collectives(ci.trace(format="dict"), [])
ci.shutdown()
bare = train()
print(json.dumps({"spans": [{"attributes": n["attributes"]} for n in spans],
                  "same": with_cirron == bare}))
""")
    assert found["same"]
    spans = found["spans"]
    assert len(spans) == 3  # one bucket a backward
    for span in spans:
        assert span["attributes"]["collective.op"] == "all_reduce"  # what the hook called
        assert span["attributes"]["collective.bucket"] == 0
        assert span["attributes"]["collective.bytes"] == 4 * (8 * 2 + 2)


def test_uninstrument_puts_every_collective_back():
    found = run("""
ddp = torch.nn.parallel.DistributedDataParallel
patched = [dist.all_reduce, dist.barrier, ddp.register_comm_hook]
ci.shutdown()
back = [dist.all_reduce, dist.barrier, ddp.register_comm_hook]
print(json.dumps({"ours": ["cirron" in f.__code__.co_filename for f in patched],
                  "back": ["cirron" in f.__code__.co_filename for f in back]}))
""")
    assert found["ours"] == [True, True, True]
    assert found["back"] == [False, False, False]


def test_on_cuda_a_span_ends_when_the_device_passed_the_work_not_when_the_call_returns():
    # No GPU here: the CUDA event is a stand-in whose synchronize() returns 80 ms after it was
    # recorded, as a device still running the collective would (the GPU run is
    # test_an_nccl_collective_ends_behind_its_work, in scripts/gpu-checks.sh).
    found = run("""
import time, threading
from cirron.instrumentors import torch_collectives

class Event:
    def record(self):
        self.recorded = time.monotonic()
    def synchronize(self):
        self.thread = threading.current_thread().name
        time.sleep(max(0.0, self.recorded + 0.08 - time.monotonic()))

class Cuda:
    Event = Event

torch_collectives.CUDA[0] = Cuda
torch_collectives._is_cuda = lambda payload: True
started = time.monotonic()
dist.all_reduce(torch.ones(4))
returned_ms = (time.monotonic() - started) * 1e3
torch_collectives.settle()
report(returned_ms=returned_ms)
""")
    (span,) = found["spans"]
    assert found["returned_ms"] < 40  # the call itself did not wait for the "device"
    assert span["duration_ns"] >= 80e6
    assert found["health"]["hook_errors"] == 0


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA GPU")
def test_an_nccl_collective_ends_behind_its_work_on_a_gpu():
    found = run_python(
        """
import json, os, time, torch, torch.distributed as dist
import cirron as ci
from cirron.instrumentors import torch_collectives

ci.profile(output="none", frameworks=["torch"])
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(1 << 20, device="cuda")
torch.cuda._sleep(200_000_000)  # the device busy ~0.1 s before the collective can run
started = time.time_ns()
dist.all_reduce(t)
returned = time.time_ns() - started
torch.cuda.synchronize()
torch_collectives.settle()
node = ci.trace(format="dict")
spans = []
def walk(n):
    if n["name"] == "collective":
        spans.append(n)
    for c in n["children"]:
        walk(c)
walk(node)
print(json.dumps({"returned_ns": returned, "attributes": spans[0]["attributes"],
                  "duration_ns": spans[0]["end_ns"] - spans[0]["start_ns"]}))
dist.destroy_process_group()
""",
        timeout=180,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(found.stdout.strip().splitlines()[-1])
    assert result["attributes"]["collective.backend"] == "nccl"
    assert result["attributes"]["collective.bytes"] == 4 << 20
    assert result["duration_ns"] > result["returned_ns"] + 20e6  # ended behind the device
