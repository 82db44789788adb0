"""cirron's own code fails while a run trains: the training must not notice.

    python own_failures.py PATH MODE

MODE:
- ``exporter-raises``: the spool exporter raises ``OSError`` on its first
  three exports, then works again.
- ``exporter-kills-its-thread``: the spool exporter raises ``SystemExit``
  (a ``BaseException``: it ends the sink's thread) on its first export.
- ``flush-thread-killed``: after a few flushes, ``SystemExit`` is raised
  inside the running flush thread from outside (as a thread is killed), then
  the run goes on without ever calling ``ci.flush()``.
- ``hook-raises``: a torch training loop whose cirron hook at every
  ``optimizer.step()`` raises (add ``--no-cirron`` for the same loop without
  cirron, to compare the losses).

Prints ``RESULT {...}`` with the losses (``hook-raises``), the spool files
seen before and after the fault, and ``ci.health()`` after shutdown.
"""

import ctypes
import json
import os
import sys
import threading
import time

import cirron as ci
from cirron.exporters import spool

path, mode = sys.argv[1], sys.argv[2]
result = {}


def spool_count():
    directory = os.path.join(path, "spool")
    return len(os.listdir(directory)) if os.path.isdir(directory) else 0


def train(batches, flush=True):
    for batch in ci.batches(range(batches)):
        with ci.scope("work", index=batch):
            ci.mark("loss", 1.0 / (batch + 1))
        if flush and batch % 10 == 9:
            ci.flush()


def break_the_exporter(error, times):
    original = spool.SpoolExporter.export
    calls = []

    def export(self, spans):
        calls.append(len(spans))
        if len(calls) <= times:
            raise error
        return original(self, spans)

    spool.SpoolExporter.export = export


def kill_thread(name, error):
    (thread,) = [t for t in threading.enumerate() if t.name == name]
    changed = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(error)
    )
    assert changed == 1, changed
    return thread


def torch_losses(with_cirron):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    losses = []
    for _epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if with_cirron:
                ci.mark("loss", loss.item())
    return losses


if mode == "hook-raises" and "--no-cirron" in sys.argv:
    print("RESULT " + json.dumps({"losses": torch_losses(False)}), flush=True)
    sys.exit(0)

if mode == "exporter-raises":
    break_the_exporter(OSError("deliberately failing exporter"), 3)
elif mode == "exporter-kills-its-thread":
    break_the_exporter(SystemExit("deliberately dying exporter"), 1)

handle = ci.profile(path=path, flush_interval=0.05, frameworks=["torch"])

if mode in ("exporter-raises", "exporter-kills-its-thread"):
    train(100)
elif mode == "flush-thread-killed":
    train(30, flush=False)
    time.sleep(0.3)
    before = spool_count()
    killed = kill_thread("cirron-flush", SystemExit)
    killed.join(5)
    result["killed_thread_ended"] = not killed.is_alive()
    # Go on training, never calling ci.flush(): only a live flush thread writes files.
    deadline = time.monotonic() + 10
    while spool_count() < before + 3 and time.monotonic() < deadline:
        train(5, flush=False)
        time.sleep(0.05)
    result["files_before"], result["files_after"] = before, spool_count()
elif mode == "hook-raises":
    from cirron.instrumentors.torch_steps import TorchLoop

    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken hook")

    TorchLoop.optimizer_stepped = broken
    result["losses"] = torch_losses(True)

result["flush_threads"] = [t.name for t in threading.enumerate()].count("cirron-flush")
ci.shutdown()
result["health"] = handle.health()
print("RESULT " + json.dumps(result), flush=True)
