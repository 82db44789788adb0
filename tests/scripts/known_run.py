"""A training run whose answers are known, for the findings: each flag makes one thing happen.

It measures, itself, the share of its loop spent in ``next(iterator)`` and prints it as the
last line of stdout (``{"wait_share": ...}``), so a test compares cirron's figure with it.
"""

from __future__ import annotations

import argparse
import json
import time

import known_clock

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30, help="steps per epoch")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--fetch-ms", type=float, default=0.0, help="the dataset's wait per batch")
parser.add_argument("--compute-ms", type=float, default=2.0, help="busy work per step")
parser.add_argument("--raise-at", type=int, help="a RuntimeError in the forward of this step")
parser.add_argument(
    "--raise-before", type=int, help="a RuntimeError in the loop, its batch fetched"
)
parser.add_argument("--nan-at", type=int, help="the loss is NaN from this step on")
parser.add_argument("--slow-at", type=int, nargs="*", default=[], help="steps 60 ms slower")
parser.add_argument("--flat-loss", action="store_true", help="a loss that does not decrease")
parser.add_argument("--skip-at", type=int, nargs="*", default=[], help="steps AMP skips")
parser.add_argument("--pause-s", type=float, default=0.0, help="a stall between epochs")
parser.add_argument("--mark", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
parser.add_argument("--leak-mb", type=int, default=0, help="host memory kept at each epoch")
parser.add_argument("--batches", action="store_true", help="the loader wrapped in ci.batches")
parser.add_argument("--sleep-ms", type=float, default=0.0, help="time.sleep in each step")
parser.add_argument("--pin", action="store_true", help="the loop runs on one core only")
parser.add_argument("--hogs", type=int, default=0, help="CPU hogs pinned to the loop's core")
parser.add_argument(
    "--known-clock", action="store_true",
    help="the wall clock moves only by the declared work: step times that load cannot change",
)  # fmt: skip
arguments = parser.parse_args()
if arguments.known_clock:
    known_clock.install()  # before cirron and OpenTelemetry bind time.time_ns

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

import cirron as ci  # noqa: E402

ci.profile()
torch.manual_seed(0)
torch.set_num_threads(1)


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return arguments.steps

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if arguments.fetch_ms:
            pause(arguments.fetch_ms)
        x = torch.randn(4)
        return x, x.sum(0, keepdim=True)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step == arguments.raise_at:
            raise RuntimeError(f"boom at step {self.step}")
        return self.linear(x)


def pause(milliseconds: float) -> None:
    time.sleep(milliseconds / 1000)
    if arguments.known_clock:
        known_clock.advance(milliseconds)


def busy(milliseconds: float) -> None:
    end = time.perf_counter() + milliseconds / 1000
    while time.perf_counter() < end:
        pass
    if arguments.known_clock:
        known_clock.advance(milliseconds)


def start_hogs() -> list[subprocess.Popen[bytes]]:
    """--pin: this process on one core; --hogs N: N processes that spin on that core too."""
    if not (arguments.pin or arguments.hogs):
        return []
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(arguments.hogs)]
    time.sleep(0.2 if hogs else 0)  # (they are spinning before the first step)
    return hogs


hogs = start_hogs()
model = Model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
loader = torch.utils.data.DataLoader(Data(), batch_size=1)
waited = 0.0
began = time.perf_counter()
kept = []  # what --leak-mb keeps: a history that only grows
for epoch in range(arguments.epochs):
    if epoch and arguments.pause_s:
        pause(arguments.pause_s * 1000)
    if arguments.leak_mb:
        kept.append(b"\x01" * (arguments.leak_mb << 20))  # every page written: resident
    iterator = iter(ci.batches(loader) if arguments.batches else loader)
    while True:
        before = time.perf_counter()
        try:
            x, y = next(iterator)
        except StopIteration:
            break
        waited += time.perf_counter() - before
        step = model.step
        if step == arguments.raise_before:
            raise RuntimeError(f"boom before step {step}")
        busy(arguments.compute_ms + (60 if step in arguments.slow_at else 0))
        if arguments.sleep_ms:
            pause(arguments.sleep_ms)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if arguments.flat_loss:
            loss = loss * 0 + 1.0 + 0.01 * ((step * 7) % 5)
        if arguments.nan_at is not None and step >= arguments.nan_at:
            loss = loss * float("nan")
        if step in arguments.skip_at:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        ci.mark("loss", loss)
        for name, value in arguments.mark:
            ci.mark(name, float(value))
        model.step += 1
total = time.perf_counter() - began
for hog in hogs:
    hog.kill()
print(json.dumps({"wait_share": waited / total}))
