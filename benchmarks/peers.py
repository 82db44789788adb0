"""Beside its peers: what cirron's hooks, TraceML and NVIDIA's one-logger each add to one step.

The step is torch_steps' MLP 3x512 (batch 64, one torch thread, a DataLoader over in-memory
tensors, cross-entropy, SGD), built by :func:`benchmarks.torch_steps._mlp_case` in every process.
Its time is the training thread's CPU time, as in the torch_steps rows (work a tool does on
threads of its own is not counted, for ours as for theirs); each figure is the median over pairs
of bare and traced samples of their difference, the share that over the median bare step.

- **cirron**, in this interpreter: ``ci.profile(output="none", frameworks=["torch"])``, bare and
  profiled rounds alternating in one process (torch_steps' pairs).
- **TraceML** (``traceml-ai``, ``.venv-traceml``), as its README shows for a plain PyTorch loop:
  ``traceml.init(mode="auto")``, ``with traceml.trace_step(model):`` around each step, the script
  started by ``traceml run``. ``init`` lasts the process, so bare (plain ``python``) and traced
  processes alternate.
- **one-logger** (``nv-one-logger-training-telemetry`` and ``nv-one-logger-otel``,
  ``.venv-onelogger``), as its README and example show: its provider with its ``OTelExporter``
  over an OpenTelemetry span exporter that drops the spans (ours has ``output="none"``),
  ``with training_iteration():`` around each step, and in a second case its example's phase spans
  too. Iteration and phase spans are exported, as every cirron step span is (its default keeps
  them from the exporters). Bare and traced rounds alternate in one process.

``bash scripts/peers-venvs.sh`` makes both venvs (``$CIRRON_TRACEML_PYTHON`` /
``$CIRRON_ONELOGGER_PYTHON`` name other interpreters, empty for none). Without either the rows
are left out; without one, or where one cannot run, its rows say why.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from . import reference, torch_steps
from .table import Row

TRACEML = "traceml-ai 0.5.0"
ONE_LOGGER = "nv-one-logger-training-telemetry 2.3.1"
_BUILD = "bash scripts/peers-venvs.sh"

# -- what runs in the subprocess ------------------------------------------------------------


def _step_objects(case: Callable[[int], None]) -> tuple[Any, Any, Any, Any]:
    """(model, optimizer, loss_fn, loader) of a torch_steps case, read from its closure.

    A peer's steps are those of the case's own objects (TraceML's steps outside ``trace_step``
    and inside it are of one model), run by :func:`benchmarks.torch_steps.steps_of`.
    """
    cells = dict(zip(case.__code__.co_freevars, case.__closure__ or (), strict=True))
    names = ("model", "optimizer", "loss_fn", "loader")
    return tuple(cells[name].cell_contents for name in names)  # type: ignore[return-value]


def _each_step_in(
    case: Callable[[int], None], around: Callable[[], AbstractContextManager[Any]]
) -> Callable[[int], None]:
    """``case``'s steps, of the same model, optimizer and loader, each inside ``with around():``,
    as a peer's README writes its loop."""
    return torch_steps.steps_of(*_step_objects(case), around=around)


def _alternate(
    cases: dict[str, Callable[[int], None]], steps: int, rounds: int
) -> dict[str, list[float]]:
    """ns per step of each case, rounds of every case back to back, the order reversed each round."""
    for case in cases.values():  # warm-up: allocator, first-call paths
        case(5)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for index in range(rounds):
        for name in list(cases) if index % 2 == 0 else reversed(list(cases)):
            cases[name](2)  # as torch_steps: past a round's first calls
            samples[name].append(torch_steps._time(cases[name], steps))
    return samples


def measure_ours(steps: int, rounds: int) -> dict[str, Any]:
    """torch_steps' pairs of bare and profiled MLP steps, the MLP alone; runs in a subprocess."""
    import torch

    torch.set_num_threads(1)
    case = torch_steps._mlp_case()
    case(5)
    return torch_steps._interleaved({"mlp": case}, steps, rounds)


def measure_traceml(steps: int, rounds: int, traced: bool) -> dict[str, list[float]]:
    """Bare MLP steps; or, ``traced``, under TraceML: steps in ``trace_step`` and steps outside it.

    ``traced`` runs under ``traceml run``, which starts the aggregator ``init`` connects to.
    """
    import torch

    torch.set_num_threads(1)
    if not traced:
        return _alternate({"bare": torch_steps._mlp_case()}, steps, rounds)
    import traceml_ai as traceml

    if traceml.init(mode="auto").disabled:  # it warns and carries on untraced: not a measurement
        raise RuntimeError("traceml.init() came back disabled (no aggregator?)")
    case = torch_steps._mlp_case()
    model = _step_objects(case)[0]
    traced_case = _each_step_in(case, functools.partial(traceml.trace_step, model))
    return _alternate({"outside": case, "traced": traced_case}, steps, rounds)


def _discarding_span_exporter() -> Any:
    """An OpenTelemetry span exporter that drops every span: a collector that costs nothing."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Discarding(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Discarding()


def _start_one_logger() -> None:
    """The provider, configured once per process, as one-logger's README does, exporting to OTel."""
    from nv_one_logger.api.config import OneLoggerConfig
    from nv_one_logger.otel.exporter.otel_exporter import OTelExporter
    from nv_one_logger.recorder.default_recorder import ExportCustomizationMode
    from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName
    from nv_one_logger.training_telemetry.api.training_telemetry_provider import (
        TrainingTelemetryProvider,
    )

    config = OneLoggerConfig(
        application_name="mlp-benchmark", session_tag_or_fn="peers", world_size_or_fn=1
    )
    # Its default blacklist keeps iteration and phase spans from the exporters. EXPORT_ALL_SPANS
    # refuses a filter and the provider always passes one, so: a blacklist of what never runs.
    never_run = [
        StandardTrainingJobSpanName.VALIDATION_SINGLE_ITERATION,
        StandardTrainingJobSpanName.TESTING_SINGLE_ITERATION,
    ]
    (
        TrainingTelemetryProvider.instance()
        .with_base_config(config)
        .with_exporter(OTelExporter(_discarding_span_exporter()))
        .with_export_customization(ExportCustomizationMode.BLACKLIST_SPANS, never_run)
        .configure_provider()
    )


def _one_logger_phases(case: Callable[[int], None]) -> Callable[[int], None]:
    """``case``'s steps, each an iteration with data loading, forward, backward and update spans."""
    from nv_one_logger.api.timed_span import timed_span
    from nv_one_logger.training_telemetry.api.context import training_iteration
    from nv_one_logger.training_telemetry.api.spans import StandardTrainingJobSpanName as Name

    model, optimizer, loss_fn, loader = _step_objects(case)

    def run(steps: int) -> None:
        batches = iter(loader)  # a new epoch a call, as the bare loop's `for`
        for _ in range(steps):
            with training_iteration():
                with timed_span(Name.DATA_LOADING):
                    batch = next(batches, None)
                    if batch is None:
                        batches = iter(loader)
                        batch = next(batches)
                optimizer.zero_grad()
                with timed_span(Name.MODEL_FORWARD):
                    loss = loss_fn(model(batch[0]), batch[1])
                with timed_span(Name.MODEL_BACKWARD):
                    loss.backward()
                with timed_span(Name.OPTIMIZER_UPDATE):
                    optimizer.step()

    return run


def measure_one_logger(steps: int, rounds: int) -> dict[str, list[list[float]]]:
    """Per case, [bare ns/step samples, traced samples]: iteration spans, and with phase spans."""
    import torch
    from nv_one_logger.training_telemetry.api.config import TrainingTelemetryConfig
    from nv_one_logger.training_telemetry.api.context import (
        application,
        training_iteration,
        training_loop,
    )
    from nv_one_logger.training_telemetry.api.training_telemetry_provider import (
        TrainingTelemetryProvider,
    )

    torch.set_num_threads(1)
    _start_one_logger()
    with application():
        TrainingTelemetryProvider.instance().set_training_telemetry_config(
            TrainingTelemetryConfig(perf_tag_or_fn="mlp-3x512", global_batch_size_or_fn=64)
        )
        with training_loop(train_iterations_start=0):
            case = torch_steps._mlp_case()
            cases = {
                "bare": case,
                "iteration": _each_step_in(case, training_iteration),
                "phases": _one_logger_phases(case),
            }
            samples = _alternate(cases, steps, rounds)
    return {name: [samples["bare"], samples[name]] for name in ("iteration", "phases")}


# -- what runs here --------------------------------------------------------------------------


def pythons() -> dict[str, str | None]:
    """The peers' interpreters: ``$CIRRON_TRACEML_PYTHON`` / ``$CIRRON_ONELOGGER_PYTHON`` when
    set (empty: none), else ``.venv-traceml`` / ``.venv-onelogger``; None for one not there."""
    root = reference.ROOT
    return {
        "traceml": reference._interpreter(
            "CIRRON_TRACEML_PYTHON", root / ".venv-traceml" / "bin" / "python"
        ),
        "one-logger": reference._interpreter(
            "CIRRON_ONELOGGER_PYTHON", root / ".venv-onelogger" / "bin" / "python"
        ),
    }


# torch_steps imports cirron at its top; a peer's venv has none, and the step never uses it.
_STAND_IN = "import json, sys, types\nsys.modules['cirron'] = types.ModuleType('cirron')\n"


def _peer_snippet(function: str, **arguments: Any) -> str:
    """:func:`reference.call_snippet` for a peer's venv: an empty ``cirron`` for torch_steps."""
    return _STAND_IN + reference.call_snippet("peers", function, **arguments)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_traceml_process(python: str, steps: int, rounds: int, traced: bool) -> Any:
    """One process of the TraceML pairs: ``python train.py``, or ``traceml run train.py``.

    A script file in a fresh directory, as ``traceml run`` wants, writing its result to a file
    (the launcher relays the script's output); free ports for its aggregator and torchrun.
    """
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CIRRON_", "OTEL_", "TRACEML_")) and key != "TRACEPARENT"
    }
    with tempfile.TemporaryDirectory(prefix="cirron-peers-") as directory:
        script, result = Path(directory) / "train.py", Path(directory) / "result.json"
        script.write_text(
            _STAND_IN
            + f"sys.path.insert(0, {str(reference.ROOT)!r})\n"
            + "from benchmarks.peers import measure_traceml\n"
            + f"value = measure_traceml(steps={steps}, rounds={rounds}, traced={traced})\n"
            + f"with open({str(result)!r}, 'w') as file:\n    json.dump(value, file)\n"
        )
        command = [python, str(script)]
        if traced:
            launcher = str(Path(python).with_name("traceml"))
            ports = ["--aggregator-port", str(_free_port()), "--master-port", str(_free_port())]
            logs = ["--logs-dir", str(Path(directory) / "logs")]
            command = [launcher, "run", *ports, *logs, str(script)]
        ran = subprocess.run(
            command, cwd=directory, env=environment, capture_output=True, text=True, timeout=600
        )
        if ran.returncode != 0 or not result.exists():
            output = (ran.stderr + ran.stdout)[-2000:]
            raise reference.SnippetFailed(f"{command[0]} exited {ran.returncode}: {output}")
        return json.loads(result.read_text())


def _last_line(error: Exception) -> str:
    """The last line of a failed process's output: usually the exception that ended it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[-1] if lines else type(error).__name__)[:200]


class _Runs:
    """The processes of ours and of each peer found, and why a peer has no figures."""

    def __init__(self, found: dict[str, str | None]) -> None:
        self.found = found
        self.ours: list[Any] = []
        self.results: dict[str, list[Any]] = {name: [] for name in found}
        self.why = {
            name: f"not installed ({_BUILD})" for name, python in found.items() if not python
        }

    def attempt(self, name: str, measure: Callable[[str], Any]) -> None:
        """``measure(python)`` for the peer ``name``, unless it is missing or failed before."""
        python = self.found[name]
        if name in self.why or python is None:
            return
        try:
            self.results[name].append(measure(python))
        except (reference.SnippetFailed, subprocess.TimeoutExpired, OSError) as error:
            self.why[name] = f"could not run here: {_last_line(error)}"
            self.results[name].clear()  # no figures from a peer that failed part of the way


def _one_logger_process(steps: int, rounds: int) -> Callable[[str], Any]:
    code = _peer_snippet("measure_one_logger", steps=steps, rounds=rounds)
    return functools.partial(reference.run_snippet, code)


def _traceml_pair(steps: int, rounds: int, traced_first: bool) -> Callable[[str], Any]:
    """A bare process and a traced one, in the order given: {"bare", "outside", "traced"}."""

    def pair(python: str) -> dict[str, list[float]]:
        result: dict[str, list[float]] = {}
        for traced in (traced_first, not traced_first):
            result.update(_run_traceml_process(python, steps, rounds, traced))
        return result

    return pair


def _measure(quick: bool, found: dict[str, str | None]) -> _Runs:
    """Ours, one-logger's and TraceML's processes, interleaved so drift hits them alike.

    Full: 30 pairs of rounds for ours and one-logger (2 processes each), 8 pairs of processes
    for TraceML; quick: a process (a pair) each.
    """
    steps, rounds, runs, pairs = (20, 2, 1, 1) if quick else (40, 15, 2, 8)
    measured = _Runs(found)
    for index in range(pairs):
        if index % (pairs // runs) == 0:  # spread among TraceML's pairs
            code = reference.call_snippet("peers", "measure_ours", steps=steps, rounds=rounds)
            measured.ours.append(reference.run_snippet(code))
            measured.attempt("one-logger", _one_logger_process(steps, rounds))
        measured.attempt("traceml", _traceml_pair(steps, rounds, index % 2 == 1))
    return measured


def _share(figures: torch_steps._Figures, name: str) -> float:
    return 100 * figures.added(name) / figures.bare(name)


def _beside(
    versus: str,
    ours: torch_steps._Figures,
    theirs: torch_steps._Figures | None,
    case: str,
    note: str,
) -> list[Row]:
    """Our added time and share beside a peer's case (None: the note says why it has none)."""
    spread = ours.spread("mlp") or 0.0
    if theirs:
        pairs = len(theirs.pairs[case])
        note += f"; its bare step {theirs.bare(case) / 1000:.0f} us"
        if (their_spread := theirs.spread(case)) is not None:
            note += f", its spread ±{their_spread / 1000:.1f} us over {pairs} pairs"
    return [
        Row(
            f"  added, vs {versus}",
            ours.added("mlp"),
            f"added by {versus}",
            theirs.added(case) if theirs else None,
            "us",
            spread=spread,
            note=note,
        ),
        Row(
            f"  share, vs {versus}",
            _share(ours, "mlp"),
            f"share, {versus}",
            _share(theirs, case) if theirs else None,
            "%",
            spread=100 * spread / ours.bare("mlp"),
        ),
    ]


def _traceml_figures(
    pairs: list[dict[str, list[float]]],
) -> tuple[torch_steps._Figures | None, torch_steps._Figures | None]:
    """TraceML across its pairs of processes, and trace_step alone within the traced ones."""
    if not pairs:
        return None, None
    bare = [statistics.median(pair["bare"]) for pair in pairs]
    traced = [statistics.median(pair["traced"]) for pair in pairs]
    across = torch_steps._Figures([{"mlp": [bare, traced]}])
    within = torch_steps._Figures([{"mlp": [pair["outside"], pair["traced"]]} for pair in pairs])
    return across, within


def _notes(
    why: dict[str, str], ours: torch_steps._Figures, traceml_itself: torch_steps._Figures | None
) -> dict[str, str]:
    """How each was turned on (or why a peer has no figures), for the rows' notes."""
    itself = traceml_itself.added("mlp") / 1000 if traceml_itself else 0.0
    return {
        "cirron": 'ci.profile(output="none", frameworks=["torch"]), its torch hooks (step, '
        "data_load, forward, backward, optimizer_step spans), bare and profiled rounds "
        f"alternating in one process, {len(ours.pairs['mlp'])} pairs",
        "traceml": why.get("traceml")
        or f'{TRACEML} as its README shows: traceml.init(mode="auto") and `with '
        "traceml.trace_step(model):` around each step, the script run by `traceml run`; init "
        "lasts the process, so bare (plain python) and traced processes alternate, the figure "
        "the median over pairs of processes of the difference of their median rounds; "
        f"trace_step alone, against steps outside it in the traced processes: {itself:.1f} us",
        "one-logger": why.get("one-logger")
        or f"{ONE_LOGGER} as its README shows: its TrainingTelemetryProvider with its "
        "OTelExporter (nv-one-logger-otel) over an OTel span exporter that drops the spans, "
        "application() and training_loop() around the run, `with training_iteration():` around "
        "each step, iteration spans exported (its default keeps them from the exporters); bare "
        "and traced rounds alternating in one process",
        "phases": why.get("one-logger")
        or "the same with its example's phase spans in each iteration: timed_span DATA_LOADING "
        "(the fetch), MODEL_FORWARD (model and loss), MODEL_BACKWARD, OPTIMIZER_UPDATE",
    }


def run(quick: bool = False) -> list[Row]:
    """Our added time and share on the MLP step, beside TraceML's and one-logger's."""
    found = pythons()
    if not any(found.values()):
        raise ImportError(f"neither peer's venv is there: {_BUILD}")
    measured = _measure(quick, found)
    ours = torch_steps._Figures(measured.ours)
    one_logger_runs = measured.results["one-logger"]
    one_logger = torch_steps._Figures(one_logger_runs) if one_logger_runs else None
    traceml, traceml_itself = _traceml_figures(measured.results["traceml"])
    notes = _notes(measured.why, ours, traceml_itself)
    return [
        Row(
            "MLP 3x512 step, cirron's hooks on",
            ours.bare("mlp") + ours.added("mlp"),
            "same step, no hooks",
            ours.bare("mlp"),
            "us",
            spread=ours.spread("mlp"),
            note=notes["cirron"],
        ),
        *_beside("TraceML", ours, traceml, "mlp", notes["traceml"]),
        *_beside("one-logger", ours, one_logger, "iteration", notes["one-logger"]),
        *_beside("one-logger, phases", ours, one_logger, "phases", notes["phases"]),
    ]
