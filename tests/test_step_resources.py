"""What each step cost the machine, on its span: the training thread's CPU time, the
process's resident memory, and on CUDA the allocator's peaks during the step. Each is
checked against a loop whose answer is known: a step that sleeps uses no CPU, one that
spins uses all of its time, one that keeps a 200 MB buffer grows the process by it."""

from __future__ import annotations

import time

import pytest

import cirron as ci

torch = pytest.importorskip("torch")

MB = 1 << 20
EVERY_STEP = {"step_resources_interval": 0}  # (by default, one short step every 0.1 s)


def steps_of(trace) -> list[dict]:
    found = []

    def walk(node):
        if node["name"] in ("step", "batch"):
            found.append(node)
        for child in node["children"]:
            walk(child)

    walk(trace)
    return sorted(found, key=lambda node: node["index"])


def spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def known_loop(work) -> list[dict]:
    """A plain torch loop of 6 steps; ``work(i)`` runs inside step i."""
    ci.profile(output="none", frameworks=["torch"], config=EVERY_STEP)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
    for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8)):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        work(i)
        optimizer.step()
    ci.shutdown()
    return steps_of(ci.trace(format="dict"))


def test_a_sleeping_step_uses_no_cpu_and_a_spinning_one_all_of_its_time():
    def work(i):
        if i == 2:
            time.sleep(0.1)
        if i == 4:
            spin(0.1)

    steps = known_loop(work)
    assert [s["index"] for s in steps] == list(range(6))
    sleeping, spinning = steps[2], steps[4]
    assert sleeping["duration_ns"] > 100e6 and sleeping["attributes"]["cpu_ns"] < 20e6
    assert spinning["attributes"]["cpu_ns"] >= 100e6
    assert spinning["attributes"]["cpu_ns"] <= spinning["duration_ns"] * 1.05
    # Every step has its figure: they add up to the CPU the loop used, nothing counted twice.
    assert all(s["attributes"]["cpu_ns"] >= 0 for s in steps)


def test_a_step_that_keeps_200_mb_grows_the_process_by_200_mb():
    kept = []

    def work(i):
        if i == 3:
            buffer = bytearray(200 * MB)
            buffer[::4096] = b"x" * len(buffer[::4096])  # touch every page: resident now
            kept.append(buffer)

    steps = known_loop(work)
    rss = [s["attributes"]["process.memory.usage"] for s in steps]
    assert rss[3] - rss[2] >= 195 * MB
    assert abs(rss[2] - rss[1]) < 20 * MB and abs(rss[4] - rss[3]) < 20 * MB


def test_ci_batches_steps_have_their_figures_too():
    ci.profile(output="none", frameworks=[], config=EVERY_STEP)
    for i in ci.batches(range(4)):
        if i == 1:
            spin(0.05)
    ci.shutdown()
    batches = steps_of(ci.trace(format="dict"))
    assert [b["index"] for b in batches] == [0, 1, 2, 3]
    assert batches[1]["attributes"]["cpu_ns"] >= 50e6
    assert all(b["attributes"]["process.memory.usage"] > 10 * MB for b in batches)


def test_short_steps_carry_their_figures_once_an_interval_and_long_ones_always():
    ci.profile(output="none", frameworks=[], config={"step_resources_interval": 0.05})
    for i in ci.batches(range(60)):
        time.sleep(0.1 if i >= 50 else 0.002)  # 50 short steps (~0.1 s), then 10 long ones
    ci.shutdown()
    batches = steps_of(ci.trace(format="dict"))
    measured = [b["index"] for b in batches if "cpu_ns" in b["attributes"]]
    # One short step every 0.05 s: the first, then the first to begin 0.05 s after the last
    # measured one began (counted in time, not in steps: a loaded machine's steps are longer).
    last_measured = None
    for b in batches[:50]:
        if "cpu_ns" in b["attributes"]:
            assert last_measured is None or b["start_ns"] - last_measured > 0.04e9, measured
            last_measured = b["start_ns"]
        else:
            assert last_measured is not None and b["start_ns"] - last_measured < 0.06e9
    assert 0 in measured, measured
    # Steps longer than the interval: each one after the first (whose beginning came too soon
    # after the last measured short step).
    assert set(range(51, 60)) <= set(measured)
    for b in batches:
        if "cpu_ns" in b["attributes"]:
            assert b["attributes"]["process.memory.usage"] > 10 * MB
            assert b["attributes"]["cpu_ns"] <= b["duration_ns"] * 1.05
        else:
            assert "process.memory.usage" not in b["attributes"]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="a process that can use CUDA may have it initialised"
)
def test_cpu_runs_have_no_cuda_memory_attributes():
    steps = known_loop(lambda i: None)
    assert not any(key.startswith("cuda.") for s in steps for key in s["attributes"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_each_step_has_the_cuda_peak_it_reached_and_the_next_starts_afresh():
    ci.profile(output="none", frameworks=["torch"], config=EVERY_STEP)
    model = torch.nn.Linear(256, 256).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(5):
        optimizer.zero_grad()
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        if i == 2:
            big = torch.empty(256 * MB, dtype=torch.uint8, device="cuda")
            del big  # freed before the step ends: only the peak shows it
        optimizer.step()
    torch.cuda.synchronize()
    ci.shutdown()
    steps = steps_of(ci.trace(format="dict"))
    peaks = [s["attributes"]["cuda.memory.peak_allocated"] for s in steps]
    reserved = [s["attributes"]["cuda.memory.peak_reserved"] for s in steps]
    # The others hold the model, its gradients and cuBLAS's workspace: tens of MB.
    assert peaks[2] >= 256 * MB and peaks[3] < 160 * MB and peaks[1] < 160 * MB
    assert peaks[2] - max(peaks[1], peaks[3]) >= 250 * MB
    assert all(r >= p for r, p in zip(reserved, peaks, strict=True))


@pytest.mark.parametrize("interval", [0, 0.1])
def test_cpu_spent_between_the_fetch_and_the_forward_is_the_steps(interval):
    """A step begins at its batch's fetch, and so does its CPU time: a loop that spins
    30 ms of CPU before each forward has steps of at least 30 ms of CPU, whether every
    step is measured or one an interval (the first step of each epoch included)."""
    ci.profile(output="none", frameworks=["torch"], config={"step_resources_interval": interval})
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
    for _epoch in range(2):
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            spin(0.03)  # the user's own work on the batch, before the model sees it
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    ci.shutdown()
    steps = steps_of(ci.trace(format="dict"))
    measured = [s for s in steps if "cpu_ns" in s["attributes"]]
    assert len(steps) == 12 and steps[0] in measured and len(measured) >= 3
    assert interval or len(measured) == 12  # the first step of the second epoch too
    for step in measured:
        assert 30e6 <= step["attributes"]["cpu_ns"] <= step["duration_ns"] * 1.05, step


def test_ci_batches_count_the_cpu_of_their_fetch():
    """A ``ci.batches`` batch begins before its fetch: a loader whose items cost 20 ms of CPU
    each makes batches of at least 20 ms of CPU."""

    def costly_items():
        for i in range(4):
            spin(0.02)
            yield i

    ci.profile(output="none", frameworks=[], config={"step_resources_interval": 0.1})
    for _ in ci.batches(costly_items()):
        pass
    ci.shutdown()
    batches = steps_of(ci.trace(format="dict"))
    measured = [b for b in batches if "cpu_ns" in b["attributes"]]
    assert len(batches) == 4 and batches[0] in measured
    assert all(b["attributes"]["cpu_ns"] >= 20e6 for b in measured), measured
