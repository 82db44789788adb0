"""Per-step cost of the torch hooks: bare vs instrumented, in interleaved rounds.

- MLP 3x512, batch 64, one torch thread, DataLoader over in-memory tensors:
  the relative overhead of every hook (data_load, step, forward, loss,
  backward, optimizer_step) on a small but real step.
- A 400-module model vs a 4-module model: the added time per step must not
  grow with the number of submodules (only the outermost call is a span).
  That time is noisy (the deep model's step is mostly Python), so the same
  claim is also counted exactly: the Python and C calls the hooks add to a
  step (``sys.setprofile``), for both models and for the MLP step.
- The instructions the hooks add to a trivial step, counted by valgrind's
  callgrind where it is installed: on this shared machine timed pairs vary by
  more than the targets, a count of instructions does not, so a change to the
  hooks shows in it even when it is smaller than the noise.

:func:`measure` runs in fresh processes under this package and under the
reference SDK alike (:func:`benchmarks.reference.call_snippet`), ours and the
reference's alternating; both install their torch hooks on ``ci.profile``
and remove them on ``ci.shutdown``, which is what the pairs need.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import cirron as ci

from . import reference
from .counted import PURE_PYTHON, instructions_per_step
from .table import Row, half_iqr, median_interval

# What a step runs inside when nothing is turned on around it: one object, reused, so the
# bare step pays the same ``with`` as a step a peer wraps (a fraction of a microsecond).
_NOTHING_AROUND = contextlib.nullcontext()


def _loader_loop(model: Any, inputs: Any, labels: Any, batch: int) -> Callable[[int], None]:
    """``run(steps)``: SGD steps of ``model`` over a DataLoader of the data, as many as asked."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=batch)
    return steps_of(model, optimizer, nn.CrossEntropyLoss(), loader)


def steps_of(
    model: Any,
    optimizer: Any,
    loss_fn: Any,
    loader: Any,
    around: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Callable[[int], None]:
    """``run(steps)``: steps over ``loader``, as many as asked, each inside ``with around():``
    when given (a peer turned on around each step, as its README writes the loop:
    :mod:`benchmarks.peers`)."""

    def run(steps: int) -> None:
        done = 0
        while done < steps:
            for x, y in loader:
                with _NOTHING_AROUND if around is None else around():
                    optimizer.zero_grad()
                    loss_fn(model(x), y).backward()
                    optimizer.step()
                done += 1
                if done == steps:
                    break

    return run


def _mlp_case() -> Callable[[int], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    return _loader_loop(model, torch.randn(64 * 8, 512), torch.randint(0, 10, (64 * 8,)), 64)


def _trivial_case(batches: int = 8) -> Callable[[int], None]:
    """A step with (almost) no work: one parameter, a one-element batch (about 90 us bare), in
    epochs of ``batches`` steps. The hooks' own cost shows here with the caches warm and little
    noise."""
    import torch
    from torch import nn

    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(1))

        def forward(self, x: Any) -> Any:
            return x * self.weight

    return _loader_loop(Scale(), torch.ones(batches, 1), torch.zeros(batches, dtype=torch.long), 1)


def _conv_case() -> Callable[[int], None]:
    """A realistic step: a small conv net on 32x32 images, batch 32 (15-25 ms on one thread)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    images = torch.randn(32 * 8, 3, 32, 32)
    return _loader_loop(model, images, torch.randint(0, 10, (32 * 8,)), 32)


def _deep_case(blocks: int) -> Callable[[int], None]:
    """``blocks`` tiny Linear+ReLU pairs inside one Sequential: 2*blocks+1 modules."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(blocks):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(4, 8)

    def run(steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            model(inputs).sum().backward()
            optimizer.step()

    return run


def _time(case: Callable[[int], None], steps: int) -> float:
    started = time.thread_time_ns()
    case(steps)
    return (time.thread_time_ns() - started) / steps


def _interleaved(
    cases: dict[str, Callable[[int], None]],
    steps: int,
    rounds: int,
    steps_of: dict[str, int] | None = None,
) -> dict[str, tuple[list[float], list[float]]]:
    """Per case: (bare ns/step samples, instrumented ns/step samples).

    ``steps_of``: fewer steps a half for a case whose steps are long.

    Many short pairs, bare and instrumented back to back in alternating order,
    so the machine's drift (a noisy neighbour, frequency changes) hits both
    halves of a pair alike; the figure is the median over pairs.
    """
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in cases}
    for round_index in range(rounds):
        for name, case in cases.items():
            for instrumented in (False, True) if round_index % 2 else (True, False):
                ci.shutdown()
                if instrumented:
                    ci.profile(output="none", frameworks=["torch"])
                case(2)  # the first steps after profile() pay for first calls
                samples[name][instrumented].append(_time(case, (steps_of or {}).get(name, steps)))
            ci.shutdown()
    return samples


def measure(steps: int, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """Pairs of (bare, instrumented) ns per step for each case; runs in a subprocess."""
    import torch

    torch.set_num_threads(1)
    cases = {
        "mlp": _mlp_case(),
        "deep400": _deep_case(200),
        "deep4": _deep_case(2),
        "conv": _conv_case(),
    }
    for case in cases.values():  # warm-up: allocator, first-call paths
        case(5)
    # The conv step is ~8x the MLP's, and its pairs vary by 2 % of a step: 16 steps a half
    # (of the MLP's 40) resolve the tenths of a percent its target is about.
    return _interleaved(cases, steps, rounds, {"conv": max(2, steps * 2 // 5)})


# The hooks' work on an MLP step, in layers, each measured with the layers below it on: the
# layer's entry points are replaced by no-ops (module, attributes) for the rounds without it.
# A benchmark may reach into the package's internals; a test runs it in quick mode, so a
# renamed entry point fails there, not silently here.
_LAYERS = (
    ("hook entries alone", ()),  # the wrappers run, and record nothing
    (
        "+ steps, epochs, boundaries",
        (
            (
                "cirron.instrumentors.torch_steps:TorchLoop",
                (
                    "fetch_begins",
                    "fetch_ends",
                    "training_work",
                    "backward_done",
                    "optimizer_stepping",
                    "optimizer_stepped",
                ),
            ),
        ),
    ),  # fmt: skip
    (
        "+ hook spans",
        (
            ("cirron.recording.hook_spans", ("begin", "record_on")),
            # (each hook module holds open_hook itself: the compiled one, where it is built)
            ("cirron.instrumentors.torch_modules", ("open_hook",)),
            ("cirron.instrumentors.torch_optim", ("open_hook",)),
        ),
    ),
    (
        "+ step CPU time, memory",
        (("cirron.training.resources", ("cpu_mark", "step_ends")),),
    ),
)


def _switched_off(layers: Any) -> Any:
    """Replace the entry points of ``layers`` by no-ops; returns how to put them back."""
    import importlib

    undo = []
    for _name, entries in layers:
        for target, attributes in entries:
            module_name, _, attribute = target.partition(":")
            holder = importlib.import_module(module_name)
            if attribute:
                holder = getattr(holder, attribute)
            for name in attributes:
                undo.append((holder, name, getattr(holder, name)))
                setattr(holder, name, lambda *args, **kwargs: None)
    return undo


def itemise(case_name: str, steps: int, rounds: int) -> dict[str, list[float]]:
    """ns per step of ``case_name`` ("mlp", "trivial") with no hooks ("bare") and with the
    hooks' layers on, one more at a time (:data:`_LAYERS`), in interleaved rounds; runs in a
    subprocess, under this package only."""
    import torch

    torch.set_num_threads(1)
    case = {"mlp": _mlp_case, "trivial": _trivial_case}[case_name]()
    case(5)
    names = ["bare", *(name for name, _ in _LAYERS)]
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for position in range(len(names)) if round_index % 2 else reversed(range(len(names))):
            ci.shutdown()
            undo = _switched_off(_LAYERS[position:]) if position else []
            try:
                if position:
                    ci.profile(output="none", frameworks=["torch"])
                case(2)
                samples[names[position]].append(_time(case, steps))
                ci.shutdown()
            finally:
                for holder, name, original in undo:
                    setattr(holder, name, original)
    return samples


def background(steps: int) -> dict[str, float]:
    """The CPU time of cirron's own threads (flush, sinks, sampler, metric reader) per MLP
    step, with the default settings (spool and metrics on), from the first step until
    ``ci.flush()`` returned: the work done off the training thread. Under this package only."""
    import torch

    torch.set_num_threads(1)
    case = _mlp_case()
    case(5)
    ci.profile(frameworks=["torch"])
    case(20)  # warm: the instruments are made, the first files written
    ci.flush()
    before = _threads_cpu()
    process, thread = time.process_time_ns(), time.thread_time_ns()
    case(steps)
    ci.flush()
    others = (time.process_time_ns() - process) - (time.thread_time_ns() - thread)
    after = _threads_cpu()
    ci.shutdown()
    split = {name: (after.get(name, 0) - before.get(name, 0)) / steps for name in SINK_THREADS}
    return {"ns": others / steps, **split}


# cirron's threads whose CPU per step the MLP rows name, each with the work it does.
SINK_THREADS = {
    "cirron-sink-metrics": "the metrics sink (step figures, marks, ci.metrics() rows)",
    "cirron-sink-spool": "the spool sink (encoding, gzip, step rows, index)",
    "cirron-flush": "the flush thread (building hook spans, handing out batches)",
}


def _threads_cpu() -> dict[str, int]:
    """The CPU nanoseconds of each of cirron's threads named in :data:`SINK_THREADS`."""
    import threading

    found = {}
    for thread in threading.enumerate():
        if thread.name in SINK_THREADS and thread.ident is not None:
            clock = time.pthread_getcpuclockid(thread.ident)
            found[thread.name] = time.clock_gettime_ns(clock)
    return found


def collector(steps: int, profiled: bool) -> dict[str, float]:
    """The cyclic garbage collector on an MLP run of ``steps`` steps, default settings
    (``profiled``) or no hooks: its seconds a step, on any thread, and its full passes (each
    over every object torch made) per 10,000 steps. Under this package only."""
    import gc

    import torch

    from .process_costs import CollectorTime

    torch.set_num_threads(1)
    case = _mlp_case()
    case(5)
    gc.collect()  # (what the import and the model left due)
    if profiled:
        ci.profile(frameworks=["torch"])
    case(20)
    timer = CollectorTime()
    gc.callbacks.append(timer)
    case(steps)
    gc.callbacks.remove(timer)
    ci.shutdown()
    return {"ns": timer.seconds / steps * 1e9, "full": timer.full * 10_000 / steps}


def counted_steps(
    steps: int, profiled: bool, batches: int = 8, case_name: str = "trivial", warm: int = 30
) -> dict[str, int]:
    """``steps`` trivial steps (after ``warm`` not counted) inside ``functools.reduce``: the
    one call of the process whose instructions :func:`instructions_per_step` has callgrind
    count, on the training thread, in epochs of ``batches`` steps. Runs in a subprocess,
    under either SDK. ``case_name="mlp"``: the MLP's steps instead (epochs of 8), whose
    instructions are mostly its matrix products (callgrind runs them about 300 times slower:
    a few seconds a step).

    The garbage collector is off while they run: whether one of its passes (a million
    instructions) falls inside the 300 steps or just after them is chance, and moved the
    count by 4 %; the row "the garbage collector per step" measures it. A step's CPU time
    and memory are read every 5 s, not 0.1 s: callgrind runs the loop about 50 times slower,
    and at 0.1 s one step in three would be a measured one, where a real run of this loop
    measures one in a few hundred (the timed rows have the default)."""
    import functools
    import gc
    import os

    import torch

    os.environ["CIRRON_STEP_RESOURCES_INTERVAL"] = "5"  # (the reference SDK has no such setting)
    torch.set_num_threads(1)
    case = _trivial_case(batches) if case_name == "trivial" else _mlp_case()
    if profiled:
        ci.profile(output="none", frameworks=["torch"])
    case(warm)
    gc.collect()
    gc.disable()
    functools.reduce(lambda _, __: case(steps), range(1), None)
    gc.enable()
    ci.shutdown()
    return {"steps": steps}


def instructions(steps: int) -> dict[str, float | None]:
    """Instructions per trivial step: bare and with the hooks (compiled, pure Python), ours
    and the reference's; two valgrind processes at a time (each ~2 min, mostly torch's
    import, run 50 times slower)."""
    ours = reference.call_snippet("torch_steps", "counted_steps", steps=steps, profiled=True)
    bare = reference.call_snippet("torch_steps", "counted_steps", steps=steps, profiled=False)
    # Epochs of 500 steps: what a step costs away from the epochs' boundaries.
    ours_long, bare_long = (
        reference.call_snippet(
            "torch_steps", "counted_steps", steps=steps, profiled=profiled, batches=500
        )
        for profiled in (True, False)
    )
    # The MLP's steps: what the hooks add to a step that does real work, as a share of its
    # instructions (two epochs of 8 counted, after one not counted).
    mlp = {
        profiled: reference.call_snippet(
            "torch_steps",
            "counted_steps",
            steps=MLP_COUNTED,
            profiled=profiled,
            case_name="mlp",
            warm=8,
        )
        for profiled in (True, False)
    }
    python = reference.reference_python()
    runs = {
        "mlp bare": (mlp[False], None, MLP_COUNTED),
        "mlp compiled": (mlp[True], None, MLP_COUNTED),
        "mlp pure": (PURE_PYTHON + mlp[True], None, MLP_COUNTED),
        "bare": (bare, None, steps),
        "compiled": (ours, None, steps),
        "pure": (PURE_PYTHON + ours, None, steps),
        "long bare": (bare_long, None, steps),
        "long compiled": (ours_long, None, steps),
        "long pure": (PURE_PYTHON + ours_long, None, steps),
    }
    if python:
        runs |= {"reference bare": (bare, python, steps), "reference": (ours, python, steps)}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        counting = {
            name: pool.submit(instructions_per_step, code, counted, interpreter)
            for name, (code, interpreter, counted) in runs.items()
        }
        return {name: future.result() for name, future in counting.items()}


def _calls_per_step(case: Callable[[int], None], steps: int = 10) -> float:
    """Python function calls plus C function calls made per step (``sys.setprofile`` sees both)."""
    calls = 0

    def count(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    sys.setprofile(count)
    try:
        case(steps)
    finally:
        sys.setprofile(None)
    return calls / steps


def count_calls() -> dict[str, list[float]]:
    """Per case: [calls per step bare, calls per step instrumented]; runs in a subprocess."""
    import torch

    torch.set_num_threads(1)
    cases = {"mlp": _mlp_case(), "deep400": _deep_case(200), "deep4": _deep_case(2)}
    counts: dict[str, list[float]] = {}
    for name, case in cases.items():
        case(5)
        ci.shutdown()
        bare = _calls_per_step(case)
        ci.profile(output="none", frameworks=["torch"])
        case(5)  # past the first step's one-off calls (the epoch, first lookups)
        counts[name] = [bare, _calls_per_step(case)]
        ci.shutdown()
    return counts


class _Figures:
    """Medians over every pair of every process of one SDK."""

    def __init__(self, results: list[dict[str, list[list[float]]]]) -> None:
        self.pairs: dict[str, list[tuple[float, float]]] = {}
        for result in results:
            for name, (bare, instrumented) in result.items():
                self.pairs.setdefault(name, []).extend(zip(bare, instrumented, strict=True))

    def bare(self, name: str) -> float:
        return statistics.median(off for off, _ in self.pairs[name])

    def added(self, name: str) -> float:
        return statistics.median(on - off for off, on in self.pairs[name])

    def spread(self, name: str) -> float | None:
        """Half the interquartile range of the added time over pairs."""
        return half_iqr(on - off for off, on in self.pairs[name])

    def interval(self, name: str) -> str:
        """The 95 % interval of the median added share, in words (for a row's note)."""
        bare = self.bare(name)
        bounds = median_interval(100 * (on - off) / bare for off, on in self.pairs[name])
        if bounds is None:
            return f"{len(self.pairs[name])} pairs, too few for an interval of the median"
        return (
            f"the median of {len(self.pairs[name])} pairs; 95 % interval of that median "
            f"[{bounds[0]:.2f}, {bounds[1]:.2f}] %"
        )


ADDED_NOTE = (
    " (the spread says how far one pair strays from the median; the interval, where the "
    "median itself lies: whether a target is met)"
)
PURE_NOTE = (
    "the same pairs with CIRRON_PURE_PYTHON=1, the path of a platform "
    "the compiled helper is not built for; the rows above run the compiled nn.Module.__call__, "
    "hook spans and step cycle where they are built (ci.health()['hot_path'])."
)
ITEMISED = (
    "the added time itemised, on the pure-Python hooks (the compiled step cycle does "
    "the first two layers' work in one call a hook, which no layer can switch off): each layer of the hooks' work is measured with the layers below it on and those above it "
    "replaced by no-ops, in interleaved rounds of one process of its own (so the MLP's layers "
    "need not add up to the row above exactly). The trivial step shows the hooks' own cost "
    "with little noise; on the MLP step the same work costs more, its caches cold after the "
    "step's kernels."
)


def run(quick: bool = False) -> list[Row]:
    """The MLP step, the share the hooks add to it, and the added time on a deep model."""
    import torch  # noqa: F401 - ImportError: the caller skips these rows

    # Full: 30 pairs per case and SDK, in 2 processes each, ours and the reference's alternating.
    steps, rounds, runs = (20, 2, 1) if quick else (40, 15, 2)
    code = reference.call_snippet("torch_steps", "measure", steps=steps, rounds=rounds)
    ours_results, reference_results = reference.run_both(code, runs)
    ours = _Figures(ours_results)
    # The same under the pure-Python hooks, which every platform without the compiled
    # helper runs (cirron.recording.hot); the rows above use the compiled one where it is built.
    pure = _Figures([reference.run_snippet(PURE_PYTHON + code) for _ in range(runs)])
    theirs = _Figures(reference_results) if reference_results else None
    # Deterministic: one process per SDK is enough.
    ours_calls, reference_calls = reference.run_both(
        reference.call_snippet("torch_steps", "count_calls"), 1
    )

    def calls_added(counts: list[dict[str, list[float]]] | None, name: str) -> float | None:
        if not counts:
            return None
        bare, instrumented = counts[0][name]
        return instrumented - bare

    # Under this package only: the layers are ours. The trivial step is short: 10x the steps.
    layers = {
        case_name: reference.run_snippet(
            PURE_PYTHON
            + reference.call_snippet(
                "torch_steps", "itemise", case_name=case_name, steps=steps * scale,
                rounds=rounds * 2,
            )
        )
        for case_name, scale in (("mlp", 1), ("trivial", 10))
    }  # fmt: skip

    def layer(case_name: str, name: str, below: str) -> float:
        """What layer ``name`` adds to the layers below it: the median over rounds."""
        samples = layers[case_name]
        return statistics.median(
            on - off for off, on in zip(samples[below], samples[name], strict=True)
        )

    def itemised(case_name: str, note: str = "") -> list[Row]:
        names = ["bare", *(name for name, _ in _LAYERS)]
        return [
            Row(
                f"  {case_name}: {name}",
                layer(case_name, name, below),
                unit="us",
                note=note if below == "bare" else "",
            )
            for below, name in zip(names, names[1:], strict=False)
        ]

    trivial = layers["trivial"]
    if quick:  # the snippet runs (a renamed entry point fails here), not counted: minutes
        reference.run_snippet(
            reference.call_snippet("torch_steps", "counted_steps", steps=5, profiled=True)
        )
        counted: dict[str, float | None] = {}
    else:
        counted = instructions(300)
    background_runs = [
        reference.run_snippet(
            reference.call_snippet("torch_steps", "background", steps=200 if quick else 2000)
        )
        for _ in range(1 if quick else 3)
    ]
    off_thread = [run["ns"] for run in background_runs]

    # Long enough for full passes to come due (a few a 10,000 steps before the rows held for
    # ci.metrics() stopped being tracked); the median per step hides the collector's pauses.
    collected = {
        profiled: reference.run_snippet(
            reference.call_snippet(
                "torch_steps", "collector", steps=300 if quick else 6000, profiled=profiled
            )
        )
        for profiled in (False, True)
    }

    def step(figures: _Figures, name: str = "mlp") -> float:
        return figures.bare(name) + figures.added(name)

    def share(figures: _Figures, name: str = "mlp") -> float:
        return 100 * figures.added(name) / figures.bare(name)

    return [
        Row(
            "MLP 3x512 step",
            step(ours),
            "same step, no hooks",
            ours.bare("mlp"),
            "us",
            step(theirs) if theirs else None,
            spread=ours.spread("mlp"),
        ),
        Row(
            "  added by the hooks",
            share(ours),
            "",
            None,
            "%",
            share(theirs) if theirs else None,
            spread=100 * (ours.spread("mlp") or 0.0) / ours.bare("mlp"),
            note="MLP: " + ours.interval("mlp") + ADDED_NOTE,
        ),
        Row(
            "  added, pure-Python hooks",
            share(pure),
            "",
            None,
            "%",
            spread=100 * (pure.spread("mlp") or 0.0) / pure.bare("mlp"),
            note=f"{pure.interval('mlp')}; {PURE_NOTE}",
        ),
        Row(
            "conv net step (10-50 ms)",
            step(ours, "conv"),
            "same step, no hooks",
            ours.bare("conv"),
            "us",
            step(theirs, "conv") if theirs else None,
            spread=ours.spread("conv"),
        ),
        Row(
            "  added by the hooks",
            share(ours, "conv"),
            "",
            None,
            "%",
            share(theirs, "conv") if theirs else None,
            spread=100 * (ours.spread("conv") or 0.0) / ours.bare("conv"),
            note="conv net: " + ours.interval("conv"),
        ),
        Row(
            "added per step, 401 modules",
            ours.added("deep400"),
            "added per step, 5 modules",
            ours.added("deep4"),
            "us",
            theirs.added("deep400") if theirs else None,
            spread=ours.spread("deep400"),
        ),
        Row(
            "  401 modules, pure-Python hooks",
            pure.added("deep400"),
            "added per step, 5 modules",
            pure.added("deep4"),
            "us",
            spread=pure.spread("deep400"),
        ),
        *itemised("mlp", ITEMISED),
        Row(
            "  MLP: cirron's threads' CPU per step",
            statistics.median(off_thread),
            unit="us",
            spread=half_iqr(off_thread),
            note="off the training thread (building hook spans, the spool, the metrics, the "
            "sampler), default settings, until ci.flush() returned; median of processes",
        ),
        *(
            Row(
                f"    of which {thread}",
                statistics.median(run[thread] for run in background_runs),
                unit="us",
                note=work,
            )
            for thread, work in SINK_THREADS.items()
        ),
        Row(
            "  MLP: the garbage collector per step",
            collected[True]["ns"],
            unit="us",
            note="the cyclic collector's time on any thread over an MLP run of 6,000 steps, "
            "default settings; its full passes (each over every object torch made) per 10,000 "
            f"steps: {collected[True]['full']:.1f}. The same steps with no hooks: "
            f"{collected[False]['ns'] / 1000:.2f} us a step, {collected[False]['full']:.1f} "
            "full passes",
        ),
        Row(
            "trivial step (1 parameter)",
            statistics.median(trivial[_LAYERS[-1][0]]),
            "same step, no hooks",
            statistics.median(trivial["bare"]),
            "us",
        ),
        *itemised("trivial"),
        Row(
            "calls added per MLP step",
            calls_added(ours_calls, "mlp") or 0.0,
            "calls per step, no hooks",
            ours_calls[0]["mlp"][0] if ours_calls else None,
            "calls",
            calls_added(reference_calls, "mlp"),
        ),
        Row(
            "calls added per step, 401 modules",
            calls_added(ours_calls, "deep400") or 0.0,
            "calls added, 5 modules",
            calls_added(ours_calls, "deep4"),
            "calls",
            calls_added(reference_calls, "deep400"),
        ),
        *_instruction_rows(counted),
    ]


MLP_COUNTED = 16  # MLP steps callgrind counts: two epochs (a few seconds a step under it)


def _instruction_rows(counted: dict[str, float | None]) -> list[Row]:
    """The instructions a trivial step's hooks add (thousands), where callgrind counted them."""
    bare, compiled, pure = counted.get("bare"), counted.get("compiled"), counted.get("pure")
    if bare is None or compiled is None or pure is None:
        return []
    theirs, theirs_bare = counted.get("reference"), counted.get("reference bare")
    reference_added = theirs - theirs_bare if theirs is not None and theirs_bare else None
    return [
        Row(
            "instructions added per trivial step",
            (compiled - bare) / 1000,
            "instructions per step, no hooks",
            bare / 1000,
            "k",
            reference_added / 1000 if reference_added is not None else None,
            note="counted by valgrind's callgrind on the training thread, 300 steps: within a "
            "few thousand from run to run, where the timed rows vary by more than the targets",
        ),
        Row(
            "  pure-Python hooks",
            (pure - bare) / 1000,
            "added, compiled hooks",
            (compiled - bare) / 1000,
            "k",
        ),
        *_long_epoch_rows(counted),
        *_mlp_instruction_rows(counted),
    ]


def _mlp_instruction_rows(counted: dict[str, float | None]) -> list[Row]:
    """What the hooks add to an MLP step's instructions on the training thread, as a share of
    them: the training-thread CPU of the timed rows, counted instead of timed."""
    bare, compiled, pure = (counted.get(f"mlp {name}") for name in ("bare", "compiled", "pure"))
    if not bare or compiled is None or pure is None:
        return []
    note = (
        f"{MLP_COUNTED} MLP steps (two epochs) counted by callgrind on the training thread: "
        f"{(compiled - bare) / 1000:.1f}k instructions added by the compiled hooks, "
        f"{(pure - bare) / 1000:.1f}k by the pure-Python ones, on a step of "
        f"{bare / 1e6:.2f}M; the timed rows cannot resolve a share this small on a busy "
        "machine. An upper bound for a real run: under callgrind a step lasts longer than the "
        "5 s between two measured steps, so every counted step is a measured one (its CPU "
        "time and memory read), where a real run measures one in hundreds; but a matrix "
        "product retires several instructions a cycle, the hooks' code fewer"
    )
    return [
        Row(
            "instructions added per MLP step",
            100 * (compiled - bare) / bare,
            "the same, pure-Python hooks",
            100 * (pure - bare) / bare,
            "%",
            note=note,
        )
    ]


def _long_epoch_rows(counted: dict[str, float | None]) -> list[Row]:
    """The same count in epochs of 500 steps: a step away from its epoch's boundaries."""
    bare, compiled = counted.get("long bare"), counted.get("long compiled")
    pure = counted.get("long pure")
    if bare is None or compiled is None or pure is None:
        return []
    return [
        Row(
            "  in epochs of 500 steps",
            (compiled - bare) / 1000,
            "the same, pure-Python hooks",
            (pure - bare) / 1000,
            "k",
            note="the trivial loop's epochs are 8 steps, as the MLP's are; each epoch's first "
            "batch and its end run the Python hooks, which decide where an epoch begins",
        ),
    ]
