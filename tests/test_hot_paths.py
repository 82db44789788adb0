"""The compiled twins (``cirron.recording._hot``: ``nn.Module.__call__``, the hook spans, scopes,
marks, a step's or a batch's span, the span processor) and their pure-Python twins give the same
trace: each script below runs once on each path, in this process, and the trees must match.

The other tests run on whichever path this install has (``ci.health()["hot_path"]``);
``scripts/test.sh`` runs tests/test_torch.py, test_scope.py, test_mark.py and test_loops.py once
more with ``CIRRON_PURE_PYTHON=1``.
"""

from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Any

import pytest

import cirron as ci
import cirron.training
from cirron.instrumentors import torch_modules, torch_optim, torch_spans
from cirron.otel.processor import RingBufferSpanProcessor
from cirron.recording import hook_spans, hot
from cirron.training import loops

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

pytestmark = pytest.mark.skipif(hot.compiled is None, reason="the compiled helper is not built")


class Blocks(nn.Module):
    """Nested submodules, a checkpointed block, and a forward that raises on a NaN batch."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.second = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, 2)

    def forward(self, x, scale=1.0):
        if torch.isnan(x).any():
            raise ValueError("a NaN batch")
        x = self.first(x)
        x = checkpoint(self.second, x, use_reentrant=False)
        with ci.scope("head"):
            return self.head(x) * scale


def _shape(node) -> tuple:
    """A span's name, its error status and its children's shapes: what both paths must share."""
    return (node["name"], node.get("status"), tuple(_shape(child) for child in node["children"]))


def _loop() -> tuple:
    torch.manual_seed(0)
    model, loss_fn = Blocks(), nn.CrossEntropyLoss()
    seen = []
    model.second.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(3, 4) for _ in range(4)] + [torch.full((3, 4), float("nan"))]
    for x in batches:
        optimizer.zero_grad()
        try:
            out = model(x, scale=2.0) if len(seen) % 2 else model.__call__(x)
        except ValueError:
            continue
        loss_fn(out, torch.zeros(3, dtype=torch.long)).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        model(torch.randn(3, 4))
    ci.shutdown()
    assert len(seen) == 4 + 1  # a forward hook runs for every call (a recomputation stops early)
    return _shape(ci.trace(format="dict"))


def _pure_everywhere(monkeypatch) -> None:
    """Every compiled twin replaced by its pure one, wherever a module holds it."""
    import sys

    from cirron.recording import marks, scopes

    monkeypatch.setattr(hot, "compiled", None)
    for name, twin in hook_spans.PURE_TWINS.items():
        monkeypatch.setattr(hook_spans, name, twin)
    for module in (torch_spans, torch_modules, torch_optim):
        monkeypatch.setattr(module, "open_hook", torch_spans.open_hook_pure)
    monkeypatch.setattr(scopes.Scope, "__enter__", scopes.PURE_TWINS["__enter__"])
    monkeypatch.setattr(scopes.Scope, "__exit__", scopes.PURE_TWINS["__exit__"])
    monkeypatch.setattr(ci, "scope", scopes.PURE_TWINS["scope"])
    monkeypatch.setattr(ci, "mark", marks.PURE_MARK)
    monkeypatch.setattr(loops._Batches, "__next__", loops.PURE_NEXT)
    for name in ("on_start", "on_end"):
        monkeypatch.setattr(RingBufferSpanProcessor, name, scopes.PURE_TWINS[name])
    for module in [m for name, m in sys.modules.items() if name.startswith("cirron.")]:
        for name in ("open_on", "close_span"):
            if type(getattr(module, name, None)).__name__ == "builtin_function_or_method":
                monkeypatch.setattr(module, name, scopes.PURE_TWINS[name])


def test_both_paths_give_the_same_trace(monkeypatch):
    ci.profile(output="none", frameworks=["torch"])
    assert ci.health()["hot_path"] == "compiled"
    assert type(nn.Module.__call__).__name__ == "ModuleCall"
    assert type(hook_spans.end).__name__ == "builtin_function_or_method"
    compiled = _loop()
    _pure_everywhere(monkeypatch)
    ci.profile(output="none", frameworks=["torch"])
    assert type(nn.Module.__call__).__name__ == "function"
    assert compiled == _loop()
    assert "forward" in str(compiled) and "ERROR" in str(compiled)
    assert "optimizer_step" in str(compiled) and "backward" in str(compiled)


class Flaky(torch.utils.data.Dataset):
    """Eight samples; the sixth raises once (a corrupt record), as a real dataset's may."""

    def __init__(self) -> None:
        self.raised = False

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        if i == 5 and not self.raised:
            self.raised = True
            raise ValueError("a corrupt record")
        return torch.randn(4), torch.tensor(i % 2)


_MEASURED = ("cpu", "process.")  # a step's CPU time and memory: figures that differ per run


def _full_shape(node) -> tuple:
    """A span's name, status, attributes (but measured figures), marks and children."""
    attributes = tuple(
        sorted((k, str(v)) for k, v in node["attributes"].items() if not k.startswith(_MEASURED))
    )
    marks = tuple((m["name"], m["kind"]) for m in node["marks"])
    children = tuple(_full_shape(child) for child in node["children"])
    return (node["name"], node.get("status"), attributes, marks, children)


def _steps_begin_at_their_fetch_and_never_overlap(tree) -> None:
    for epoch in (c for c in tree["children"] if c["name"] == "epoch"):
        steps = [c for c in epoch["children"] if c["name"] == "step"]
        for step in steps:  # (a manual loop's have no fetch)
            loads = [c for c in step["children"] if c["name"] == "data_load"]
            assert not loads or step["start_ns"] == loads[0]["start_ns"]
        for before, after in zip(steps, steps[1:], strict=False):
            assert before["end_ns"] <= after["start_ns"]


def _loader_loop() -> tuple:
    """The loop the compiled step cycle is for, and what it hands on around it: epochs over a
    DataLoader, gradient accumulation for a while, a skipped batch, a fetch that raises, a
    scope on a batch before its forward, a mark after each optimizer step, a validation pass
    between epochs; before them, a manual loop with no loader, and a forward after it."""
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model, loss_fn = Blocks(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Flaky(), batch_size=1)
    model.train()
    for _ in range(3):  # a manual loop, no loader: its steps in an epoch of their own
        loss_fn(model(torch.randn(2, 4)), torch.zeros(2, dtype=torch.long)).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():  # after that loop: in no step, nor in its epoch
        model(torch.randn(2, 4))
    for epoch in range(3):
        model.train()
        batches = iter(loader)
        position = 0
        while True:
            try:
                x, y = next(batches)
            except StopIteration:
                break
            except ValueError:
                continue
            position += 1
            if position == 3:
                continue  # a batch skipped: its fetch waits, then goes with the next step's
            if position == 4:  # a scope between a fetch and the forward: the Python hooks decide
                with ci.scope("augment"):
                    x = x * 1.0
            loss = loss_fn(model(x), y)
            loss.backward()
            if epoch == 0 and position % 2:
                continue  # accumulation: this step's optimizer moment comes with the next batch
            optimizer.step()
            optimizer.zero_grad()
            ci.mark("loss", loss.item())
        model.eval()
        with torch.no_grad():
            for x, _y in loader:
                model(x)
    ci.shutdown()
    tree = ci.trace(format="dict")
    _steps_begin_at_their_fetch_and_never_overlap(tree)
    return _full_shape(tree)


def _python_calls(script) -> tuple[Any, dict[str, int]]:
    """``script()``, and how often it ran the Python hooks' step logic (counted with
    ``sys.setprofile``: replacing the functions would turn the compiled cycle off)."""
    import sys

    from cirron.instrumentors.torch_steps import TorchLoop

    codes = {
        TorchLoop.fetch_ends.__code__: "fetch_ends",
        TorchLoop.training_work.__code__: "training_work",
        cirron.training.begin_step.__code__: "begin_step",
    }
    calls = dict.fromkeys(codes.values(), 0)

    def count(frame, event, _arg):
        if event == "call" and frame.f_code in codes:
            calls[codes[frame.f_code]] += 1

    sys.setprofile(count)
    try:
        result = script()
    finally:
        sys.setprofile(None)
    return result, calls


def test_a_loader_loop_gives_the_same_trace_on_both_paths(monkeypatch):
    """The compiled step cycle (the next batch, its forward, backward and optimizer step with
    no Python frame) against the pure hooks, on a loop with the moments it hands on."""
    ci.profile(output="none", frameworks=["torch"])
    assert type(torch.utils.data.dataloader._BaseDataLoaderIter.__next__).__name__ == "LoopHook"
    compiled, in_python = _python_calls(_loader_loop)
    _pure_everywhere(monkeypatch)
    ci.profile(output="none", frameworks=["torch"])
    assert type(torch.autograd.backward).__name__ == "function"
    pure, calls = _python_calls(_loader_loop)
    assert compiled == pure
    # The compiled cycle ran: most training work, and the training batches' fetches past the
    # first of each pass, never reached the Python methods (the evaluation's fetches do).
    assert in_python["training_work"] * 3 < calls["training_work"], (in_python, calls)
    assert in_python["begin_step"] * 2 < calls["begin_step"], (in_python, calls)
    assert in_python["fetch_ends"] + 10 < calls["fetch_ends"], (in_python, calls)
    text = str(compiled)
    assert text.count("'step'") >= 10 and "'validate'" in text and "'augment'" in text
    assert "'data_load', 'ERROR'" in text  # the fetch that raised


def test_a_replaced_hook_function_turns_the_compiled_cycle_off_until_it_is_back(monkeypatch):
    """A test's monkeypatch or a user's wrapper of a function the compiled cycle does the work
    of: the pure hooks run, the replacement with them; once it is back, the cycle runs again."""
    from cirron.instrumentors.torch_steps import TorchLoop

    seen = []
    original = TorchLoop.optimizer_stepped

    def wrapper(self, frame):
        seen.append(frame)
        return original(self, frame)

    ci.profile(output="none", frameworks=["torch"])
    monkeypatch.setattr(TorchLoop, "optimizer_stepped", wrapper)
    _loader_loop()
    assert len(seen) >= 10  # every optimizer step went through it
    monkeypatch.undo()
    ci.profile(output="none", frameworks=["torch"])
    _, in_python = _python_calls(_loader_loop)
    assert in_python["training_work"] < 20, in_python  # the cycle again: 40 in the pure hooks


class Breaks(torch.utils.data.Dataset):
    """Samples, every third one raising (a fetch that fails): a long epoch of them."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i):
        if i % 3 == 2:
            raise ValueError("a bad record")
        return torch.ones(1), torch.tensor(0)


def test_the_compiled_step_cycle_keeps_nothing_a_step():
    """Thousands of steps through the compiled cycle, with forwards and fetches that raise: no
    object is kept a step (allocated blocks stay flat) and no reference is taken for good."""
    import gc
    import sys

    from cirron.instrumentors.torch_steps import LOOP, TORCH
    from cirron.recording import recorder

    model = nn.Linear(1, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(torch.utils.data.DataLoader(Breaks(), batch_size=1))

    def steps(count: int) -> None:
        for position in range(count):
            try:
                x, y = next(batches)
            except ValueError:
                continue
            try:
                out = model(x * float("nan") if position % 5 == 0 else x)
                if out.isnan().any():
                    raise ArithmeticError("a NaN")  # (a failing step of the user's)
            except ArithmeticError:
                continue
            nn.functional.cross_entropy(out, y).backward()
            optimizer.step()

    ci.profile(output="none", frameworks=["torch"], metrics=False, config={"trace_buffer": 50})
    steps(1500)
    state = recorder.current.training

    def kept() -> tuple[int, ...]:
        ci.flush()
        gc.collect()
        counts = (sys.getrefcount(TORCH), sys.getrefcount(LOOP), sys.getrefcount(state))
        return (sys.getallocatedblocks(), *counts)

    before = kept()
    steps(3000)
    after = kept()
    ci.shutdown()
    assert after[1:] == before[1:]  # TORCH, LOOP, the training state: no reference kept
    assert after[0] - before[0] < 300, (before, after)  # (a leak a step: 3,000 or more)


def test_the_compiled_loop_hooks_look_like_the_functions_they_replace():
    """The compiled fetch, backward and optimizer hooks: named as the pure hooks, wrapping
    torch's own functions, a bound method on an iterator, and gone exactly with the hooks."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    originals = (_BaseDataLoaderIter.__next__, torch.autograd.backward)
    ci.profile(output="none", frameworks=["torch"])
    fetch, backward = _BaseDataLoaderIter.__next__, torch.autograd.backward
    assert type(fetch).__name__ == type(backward).__name__ == "LoopHook"
    assert fetch.__wrapped__ is originals[0] and backward.__wrapped__ is originals[1]
    assert fetch.__name__ == "__next__" and backward.__name__ == "backward"
    assert fetch.pure.__wrapped__ is originals[0]  # the pure hook, which runs all else
    batches = iter(torch.utils.data.DataLoader(list(range(3))))
    assert batches.__next__.__self__ is batches and next(batches).tolist() == [0]
    with pytest.raises(TypeError):
        _BaseDataLoaderIter.__next__()  # no iterator: the pure hook's error, never a crash
    with pytest.raises(ValueError):
        hot.compiled.LoopHook(7, None, print)
    ci.shutdown()
    assert (_BaseDataLoaderIter.__next__, torch.autograd.backward) == originals


def test_a_call_patched_before_ours_still_runs_on_the_compiled_path(monkeypatch):
    """Someone else's ``__call__`` (another tool patched it first) runs for every module."""
    torchs = nn.Module.__call__
    calls = []

    def theirs(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return torchs(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "__call__", theirs)
    ci.profile(output="none", frameworks=["torch"])
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model(torch.randn(1, 2)).sum().backward()
    ci.shutdown()
    assert calls == ["Sequential", "Linear", "ReLU"]


def test_the_compiled_hook_spans_raise_on_a_wrong_call_and_never_crash():
    """Called wrongly (by a patched hook, say), the compiled twins raise, as the pure ones do;
    a hook span of the pure twin's is ended by it."""
    with pytest.raises(AttributeError):  # (handed to the pure twin, which finds no hook span)
        hot.compiled.end(object())
    with pytest.raises(TypeError):
        hot.compiled.end()
    with pytest.raises(TypeError):
        hot.compiled.begin("forward")
    ci.profile(output="none", frameworks=["torch"])
    with ci.scope("step"):
        hook = hot.compiled.begin("forward", {"cirron.mode": "train"})
        assert hook.name == "forward" and hook.parent is not None and hook.start_ns > 0
        hot.compiled.end(hook, error=None)
        assert hook.parent is None  # built from here on
    tree = str(_shape(ci.trace(format="dict")))
    ci.shutdown()
    assert "('step', 'UNSET', (('forward', 'UNSET', ()),))" in tree


def _api_script() -> tuple:
    """Scopes and marks as a user's loop writes them, and the odd cases each path hands on."""
    import asyncio
    import threading

    ci.profile(output="none", frameworks=[], config={"max_events": 5})
    ci.mark("before", 1.0)  # no scope open: on cirron.session
    with ci.scope("epoch", index=0):
        for step in range(3):
            with ci.scope("step"):
                ci.mark("loss", 0.5 + step)
                ci.mark("lr", 1e-3, "point")
                ci.mark("seen", step, kind="point")  # an int: the pure twin's
                ci.mark("tag", "warmup", unit="none")
                ci.mark("acc", 0.9, kind="summary")
        with ci.scope("many"):
            for i in range(8):  # past max_events: the oldest dropped and counted
                ci.mark("loss", float(i))
        try:
            with ci.scope("fails"):
                raise ValueError("a bad batch")
        except ValueError:
            pass

    def moved():  # entered in one generator step, left in another context
        with ci.scope("in a generator"):
            yield 1
            yield 2

    items = moved()
    next(items)
    with ci.scope("between"):
        ci.mark("x", 2.0)
    list(items)

    @ci.scope
    def decorated():
        ci.mark("inside", 3.0)

    decorated()

    async def task():
        with ci.scope("task"):
            ci.mark("async", 4.0)

    asyncio.run(task())
    worker = threading.Thread(
        target=lambda: ci.scope("thread").__enter__().__exit__(None, None, None)
    )
    worker.start()
    worker.join()
    for _ in ci.epochs(range(2)):
        for _ in ci.batches(range(2)):
            with ci.scope("batch work"):
                ci.mark("loss", 1.5)
    with pytest.raises(ValueError):
        ci.mark("", 1.0)
    with pytest.raises(ValueError):
        ci.mark("loss", 1.0, kind="sometimes")
    with pytest.raises((TypeError, ValueError)):
        ci.scope("")
    dropped = ci.health()["marks_dropped"]
    ci.shutdown()
    tree = ci.trace(format="dict")

    def shape(node):
        marks = tuple((m["name"], m["value"], m["kind"]) for m in node["marks"])
        measured = ("cpu", "process.", "data_load")  # times and sizes differ from run to run
        attributes = tuple(
            sorted((k, str(v)) for k, v in node["attributes"].items() if not k.startswith(measured))
        )
        children = tuple(sorted(shape(child) for child in node["children"]))
        return (node["name"], node.get("status"), marks, attributes, children)

    return shape(tree), dropped


def test_scopes_and_marks_give_the_same_trace_on_both_paths(monkeypatch):
    from cirron.recording import marks, scopes

    assert type(ci.scope).__name__ == "Twin" and type(ci.mark).__name__ == "Mark"
    compiled = _api_script()
    _pure_everywhere(monkeypatch)
    assert marks.PURE_MARK is ci.mark and scopes.open_on is scopes.PURE_TWINS["open_on"]
    pure = _api_script()
    assert compiled == pure
    text = str(compiled)
    assert "'in a generator'" in text and "'thread'" in text and "'task'" in text
    assert compiled[1] == 3  # 8 marks on a span that keeps 5


def _batches_script() -> tuple:
    """``ci.batches`` every way a user's loop goes: work and marks inside, a step CPU clock
    that comes due, a break, an iterator that raises, a loop inside another's batch, a step
    of the torch hooks inside a batch, a disabled recorder. Its spans' shapes, and how often
    the pure ``__next__`` ran."""
    import sys
    import time

    ran = [0]

    def count(frame, event, _arg):
        if event == "call" and frame.f_code is loops.PURE_NEXT.__code__:
            ran[0] += 1

    def failing():
        yield from range(3)
        raise ValueError("a bad record")

    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sys.setprofile(count)
    try:
        ci.profile(enabled=False)
        assert list(ci.batches(range(3))) == [0, 1, 2]
        ci.shutdown()
        ci.profile(output="none", frameworks=["torch"])
        for epoch in ci.epochs(range(2)):
            for i in ci.batches([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]):
                with ci.scope("work"):
                    ci.mark("loss", i + epoch)
                if epoch == 1 and i == 3.0:
                    time.sleep(0.12)  # the next batch measures the step's CPU
        for i in ci.batches(range(10)):
            if i == 4:
                break
        with pytest.raises(ValueError):
            for _ in ci.batches(failing()):
                ci.mark("seen", 1.0)
        for _ in ci.batches(range(2)):
            for _ in ci.batches("ab"):
                ci.mark("inner", 1.0)
        for x in ci.batches([torch.ones(4, 2) for _ in range(3)]):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    finally:
        sys.setprofile(None)
    ci.shutdown()

    def shape(node):
        marks = tuple((m["name"], m["value"]) for m in node["marks"])
        measured = ("cpu", "process.", "data_load")  # times and sizes differ from run to run
        attributes = tuple(
            sorted((k, str(v)) for k, v in node["attributes"].items() if not k.startswith(measured))
        )
        children = tuple(shape(child) for child in node["children"])
        return (node["name"], node.get("status"), marks, attributes, children)

    return shape(ci.trace(format="dict")), ran[0]


def test_batches_give_the_same_trace_on_both_paths(monkeypatch):
    assert type(loops._Batches.__dict__["__next__"]).__name__ == "Twin"
    compiled, in_python = _batches_script()
    _pure_everywhere(monkeypatch)
    pure, calls = _batches_script()
    assert compiled == pure
    text = str(compiled)
    assert text.count("'epoch'") == 2 and text.count("'batch'") == 12 + 4 + 4 + 2 + 4 + 3
    assert "'forward'" in text and "'optimizer_step'" in text
    # The compiled __next__ ran the common case: the pure one only each loop's first item (8),
    # the calls of the disabled recorder's loop (4), and the two around each batch that
    # measured its step's CPU time (the clock, due, starts and ends in Python: one here, a
    # few more where a busy machine stalls the loop past the clock's interval).
    assert calls == 40 and in_python * 2 < calls, (in_python, calls)


def test_a_replaced_function_of_the_batches_loop_runs_with_the_pure_next(monkeypatch):
    closed = []
    original = loops.close_span

    def close_span(opened, error=None, end_ns=None):
        closed.append(opened[0].name)
        return original(opened, error, end_ns)

    ci.profile(output="none", frameworks=[])
    monkeypatch.setattr(loops, "close_span", close_span)
    assert list(ci.batches(range(5))) == list(range(5))
    assert closed == ["batch"] * 5  # each batch ended through the replacement
    monkeypatch.undo()
    assert list(ci.batches(range(5))) == list(range(5))
    assert len(closed) == 5
    ci.shutdown()
    assert [span["name"] for span in ci.trace(format="dict")["children"]] == ["batch"] * 10


def test_the_compiled_scope_and_mark_read_as_the_functions_they_stand_for():
    from cirron.recording import marks, scopes

    assert inspect.signature(ci.mark) == inspect.signature(marks.PURE_MARK)
    assert inspect.signature(ci.scope) == inspect.signature(scopes.PURE_TWINS["scope"])
    assert ci.mark.__doc__ == marks.PURE_MARK.__doc__ and ci.mark.__name__ == "mark"
    assert ci.scope.__doc__.startswith("Open a named region")
    with pytest.raises(TypeError):
        ci.mark()  # a wrong call: the pure twin's error, never a crash
    with pytest.raises(TypeError):
        scopes.Scope.__exit__()


def test_the_spool_encoder_writes_the_same_text_on_both_twins(monkeypatch):
    """Attributes and marks of every kind a span can hold, encoded by the compiled twins and
    by the pure functions: the same OTLP/JSON text, byte for byte."""
    from opentelemetry.sdk.trace import TracerProvider

    from cirron.exporters import otlp_json

    assert type(otlp_json.key_values).__name__ == "builtin_function_or_method"
    ci.profile(output="none", frameworks=[])
    values = [
        "plain", "quote \" backslash \\ tab \t", "é ünïcödé \u2028 \ud800", "", 0.5, -0.0,
        float("nan"), float("inf"), float("-inf"), 1e300, True, False, 0, -7, 2**70,
        [1, 2], ("a", "b"), b"\x00\xff", None, 1.5j,
    ]  # fmt: skip
    with ci.scope("outer", index=3, text="x", ratio=0.25, flag=True, items=[1.5, 2.5]) as outer:
        # As any code may leave them on a span's attributes (the encoder takes what it finds).
        outer.span._attributes.update({f"key{i}": value for i, value in enumerate(values)})
        for i in range(len(values)):
            ci.mark("loss", float(i))
            ci.mark("count", i, unit="steps")
            ci.mark("label", f"v{i}", kind="point")
    sdk_span = TracerProvider().get_tracer("t").start_span("sdk", attributes={"a": 1})
    sdk_span.add_event("e", {"k": "v"})
    sdk_span.end()
    from cirron.recording import recorder

    spans = [*recorder.current.store.ended_deque, sdk_span]
    ci.shutdown()
    compiled = otlp_json.encode_request(spans)
    for name, twin in otlp_json.PURE_TWINS.items():
        monkeypatch.setattr(otlp_json, name, twin)
    assert otlp_json.encode_request(spans) == compiled
    assert '"doubleValue":"NaN"' in compiled and '"name":"loss"' in compiled
    # The outer span's line outgrows the compiled encoder's buffer on the stack several times.
    assert max(map(len, compiled.splitlines())) > 4 * 768


def test_spans_off_the_common_path_are_encoded_the_same_on_both_twins(monkeypatch):
    """Spans the compiled encoder hands to the pure one (an error status, a link, events
    dropped, a remote parent, attributes that are not a dict) and the common ones around
    them (a child in a trace with a trace state): the same request text, byte for byte."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from cirron.exporters import otlp_json
    from cirron.recording import recorder

    assert type(otlp_json.scope_span).__name__ == "builtin_function_or_method"
    ci.profile(output="none", frameworks=[], config={"max_events": 2})
    remote = SpanContext(
        0x1234, 0x5678, True, TraceFlags(TraceFlags.SAMPLED), TraceState([("vendor", "v1")])
    )
    with ci.scope("under remote", n=1) as under:
        # As a span opened under a remote parent has them (the trace state comes with it).
        under.span._trace_id, under.span._parent_span = remote.trace_id, NonRecordingSpan(remote)
        with ci.scope("plain child") as child:
            child.span._trace_id = remote.trace_id
    with ci.scope("root"):
        with pytest.raises(ValueError), ci.scope("failed"):
            raise ValueError('bad "input"')
        with ci.scope("many marks") as many:
            many_span = many.span
            for i in range(4):  # past max_events: dropped, and counted
                ci.mark("loss", float(i))
        with ci.scope("linked") as linked:
            linked.span._links = (Link(remote, {"why": "retry"}),)
        with ci.scope("mapping") as mapping:
            mapping.span._attributes = MappingProxyType({"k": "v"})
    spans = [*recorder.current.store.ended_deque]
    sdk = TracerProvider().get_tracer("t").start_span("sdk")
    sdk.end()
    spans.append(sdk)
    ci.shutdown()
    assert many_span._dropped_events == 2
    compiled = otlp_json.encode_request(spans)
    for name, twin in otlp_json.PURE_TWINS.items():
        monkeypatch.setattr(otlp_json, name, twin)
    assert otlp_json.encode_request(spans) == compiled
    assert '"traceState":"vendor=v1"' in compiled and '"links":[' in compiled
    assert '"droppedEventsCount":2' in compiled and '"status":{"code":2' in compiled
    assert compiled.count('"traceState"') == 2  # the trace's two spans, each with its state


def test_an_ended_span_leaves_the_collectors_sight_unless_a_value_is_still_to_come():
    """The compiled processor untracks a span of cirron's once it ended (with its events), as
    nothing it holds refers back to it; one with an attribute still to resolve stays tracked."""
    import gc

    ci.profile(output="none", frameworks=[])
    with ci.scope("plain") as plain:
        ci.mark("loss", 0.5)
        span = plain.span
        assert gc.is_tracked(span)  # open: anything may still be set on it
    assert not gc.is_tracked(span) and not gc.is_tracked(span._events)
    assert not gc.is_tracked(span._events[0])
    with ci.scope("waiting") as waiting:
        waiting.span.defer_attribute("later", lambda final: 1 if final else None)
        deferred = waiting.span
    assert gc.is_tracked(deferred)
    ci.shutdown()
    assert deferred.attributes["later"] == 1 and span.events[0].attributes["value"] == 0.5
