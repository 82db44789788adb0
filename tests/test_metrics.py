"""OpenTelemetry metrics: marks, step times by part, counters, system samples, and where they go.

Real parts throughout: a torch loop, the spool's files, a real OTLP receiver (rotel, which
prints the metrics and their exemplars it receives), programs in subprocesses that set
their own ``MeterProvider`` (the global one can be set once per process) or run under
``opentelemetry-instrument``.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import cirron as ci
import support
from cirron.exporters.metrics_files import metrics_files, read_metrics
from cirron.metrics.from_spans import Part, step_parts
from cirron.metrics.sampler import SAMPLER_THREAD, ProcessReader, SystemSampler
from cirron.otel.health import Health

try:
    from otlp_receiver import OtlpReceiver
except ImportError:  # pragma: no cover - run from the repository root
    from tests.otlp_receiver import OtlpReceiver

BIN = Path(sys.executable).parent

TORCH_LOOP = """
    import torch
    import cirron as ci
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss.item(), phase="train")
    print("TRAINED")
"""


def train() -> None:
    exec(textwrap.dedent(TORCH_LOOP), {})


def spans_named(name: str) -> list[dict]:
    return [node for node in ci.trace(format="dict", name=name)]


def run_script(directory: Path, code: str, *, instrument: bool = False, **environment: str) -> str:
    script = directory / "train.py"
    script.write_text(textwrap.dedent(code))
    command = [str(BIN / "python"), str(script)]
    if instrument:
        command = [str(BIN / "opentelemetry-instrument"), *command]
    result = subprocess.run(
        command,
        cwd=directory,
        env=support.clean_environment(**environment),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


# -- ci.metrics() after a torch run --------------------------------------------------------


def test_loss_marks_become_a_histogram_whose_exemplars_are_the_step_spans(one_torch_thread):
    ci.profile(output="none")
    train()
    ci.shutdown()
    steps = {node["span_id"]: node for node in spans_named("step")}
    loss = ci.metrics(format="dict")["loss"]
    assert loss["kind"] == "Histogram" and len(loss["points"]) == 8
    for point in loss["points"]:
        assert point["span_id"] in steps  # the exemplar's span: the step the mark was made in
        assert point["attributes"] == {"phase": "train"}
        (value,) = [m["value"] for m in steps[point["span_id"]]["marks"] if m["name"] == "loss"]
        assert point["value"] == value


def test_each_step_time_is_split_by_part_and_the_parts_add_up_to_the_step(one_torch_thread):
    ci.profile(output="none")
    train()
    ci.flush()
    frame = ci.metrics()
    times = frame[frame.name == "cirron.step.time"]
    parts = collections.Counter(a["cirron.step.part"] for a in times.attributes)
    assert parts == {p: 8 for p in ("data_load", "forward", "backward", "optimizer_step", "other")}
    durations = frame[frame.name == "cirron.step.duration"]
    for node in spans_named("step"):
        mine = times[times.span_id == node["span_id"]]
        assert mine.value.sum() == pytest.approx(node["duration_ns"] / 1e9, rel=1e-6)
        (duration,) = durations[durations.span_id == node["span_id"]].value
        assert duration == pytest.approx(node["duration_ns"] / 1e9, rel=1e-6)
    counted = frame.groupby("name").value.sum()
    assert counted["cirron.steps"] == 8 and counted["cirron.epochs"] == 1  # the 2nd is open
    assert (frame[frame.name == "cirron.step.cpu.time"].value > 0).all()
    assert (frame[frame.name == "cirron.step.memory.usage"].value > 10_000_000).all()
    assert "cirron.samples" not in set(frame.name)  # no span knows its batch size


def test_the_parts_are_the_ones_the_report_counts(one_torch_thread):
    from cirron.offline.steps import Timeline

    profiler = ci.profile(output="none")
    train()
    ci.flush()
    timeline = Timeline(profiler.recorder.store.ended_spans())
    frame = ci.metrics()
    times = frame[frame.name == "cirron.step.time"]
    for step in timeline.steps:
        mine = times[times.span_id == format(step.span.context.span_id, "016x")]
        ours = {a["cirron.step.part"]: v for a, v in zip(mine.attributes, mine.value, strict=True)}
        theirs = {part: ns / 1e9 for part, ns in timeline.parts(step).items() if ns}
        assert ours == pytest.approx(theirs)


def test_a_part_nested_in_another_counts_once_as_lightning_nests_them():
    # optimizer_step 10 ms holding Lightning's closure: forward 3 ms, backward 4 ms.
    closure = [Part("forward", 3_000_000, []), Part("backward", 4_000_000, [])]
    parts = step_parts([Part("optimizer_step", 10_000_000, closure)], wall_ns=12_000_000)
    assert parts == {
        "data_load": 0, "forward": 3_000_000, "backward": 4_000_000,
        "optimizer_step": 3_000_000, "other": 2_000_000,
    }  # fmt: skip


def test_a_step_with_thousands_of_forwards_holds_a_few_parts_and_the_same_figures():
    # A step the sink waits for (a long one, or one a full buffer dropped) with 5,000 forwards
    # inside, each with a recomputed forward and a forward nested in a forward: what waits is a
    # part per name, and the times are those of every part.
    import random

    from cirron.metrics import from_spans

    random.seed(0)
    parts = []
    for _ in range(5_000):
        inner = [Part("forward", random.randint(1, 50), []), Part("data_load", 7, [])]
        parts.append(Part(random.choice(["forward", "backward"]), random.randint(100, 900), inner))
    sink = from_spans.SpanMetrics.__new__(from_spans.SpanMetrics)
    sink._parts = collections.OrderedDict()
    for part in parts:
        sink._pass_up(1, [part])
    held = sink._parts[1]
    assert len(held) <= from_spans._MAX_PARTS
    wall = sum(part.duration_ns for part in parts) + 1_000
    assert step_parts(held, wall) == step_parts(parts, wall)
    assert step_parts(from_spans.merged(parts), wall) == step_parts(parts, wall)


def test_ci_metrics_works_after_shutdown_and_is_empty_with_metrics_off():
    ci.profile(output="none")
    for _ in ci.batches(range(3)):
        ci.mark("loss", 0.5)
    ci.shutdown()
    assert len(ci.metrics(format="dict")["loss"]["points"]) == 3
    assert set(ci.metrics().columns) >= {"name", "time_ns", "value", "trace_id", "span_id"}
    ci.profile(output="none", metrics=False)
    ci.shutdown()
    assert ci.metrics(format="dict") == {}
    with pytest.raises(ValueError, match="format"):
        ci.metrics(format="csv")


def test_stdout_and_log_print_one_line_per_epoch_summing_up_its_steps(capsys, caplog):
    ci.profile(output=["stdout", "log"])
    with caplog.at_level(logging.INFO, logger="cirron.metrics"):
        for _ in ci.epochs(range(2)):
            for _ in ci.batches(range(3)):
                ci.mark("loss", 0.5)
        ci.shutdown()
    lines = [line for line in capsys.readouterr().out.splitlines() if "metrics epoch" in line]
    assert [line.split(":")[0] for line in lines] == [
        "[cirron] metrics epoch[0]",
        "[cirron] metrics epoch[1]",
    ]
    assert re.fullmatch(
        r"\[cirron\] metrics epoch\[0\]: 3 steps, step \S+ p50 / \S+ p95, loss 0.5, "
        r"cpu \d+%, rss \d+(\.\d+)?[MG]B(, cuda \S+ peak)?",  # cuda: torch used CUDA
        lines[0],
    ), lines[0]
    logged = [r.getMessage() for r in caplog.records if r.name == "cirron.metrics"]
    assert logged == lines


# -- bad input ------------------------------------------------------------------------------


def test_a_mark_that_is_not_a_number_is_left_out_with_one_warning_and_training_goes_on(caplog):
    ci.profile()  # the spool: an SDK meter that would complain of a negative value
    with caplog.at_level(logging.WARNING, logger="cirron"):
        for step in ci.batches(range(4)):
            ci.mark("phase", "warmup")
            ci.mark("converged", step > 2)
            ci.mark("loss", float("nan") if step == 1 else 0.25)
            ci.mark("reward", -1.0 if step else 2.0)  # an OpenTelemetry histogram takes >= 0
        ci.flush()
    recorded = ci.metrics(format="dict")
    assert "phase" not in recorded and "converged" not in recorded
    assert [p["value"] for p in recorded["loss"]["points"]] == [0.25, 0.25, 0.25]
    assert [p["value"] for p in recorded["reward"]["points"]] == [2.0]
    said = [r.getMessage() for r in caplog.records if "left out of the metrics" in r.getMessage()]
    assert len(said) == 4 and sum("'phase'" in line for line in said) == 1
    assert not [r for r in caplog.records if "non-negative" in r.getMessage()]  # not the SDK's
    assert ci.trace(format="dict", name="batch")[0]["marks"][0]["value"] == "warmup"  # kept


def test_metrics_false_starts_no_thread_and_writes_no_metrics_file(tmp_path):
    threads = {t.name for t in threading.enumerate()}
    ci.profile(metrics=False)
    assert SAMPLER_THREAD not in {t.name for t in threading.enumerate()}
    assert "cirron-sink-metrics" not in {t.name for t in threading.enumerate()}
    for _ in ci.batches(range(2)):
        ci.mark("loss", 0.1)
    ci.shutdown()
    assert not (tmp_path / ".cirron" / "metrics").exists()
    assert {t.name for t in threading.enumerate()} <= threads


def test_metrics_can_be_turned_off_by_the_environment_and_a_bad_value_warns(monkeypatch, caplog):
    monkeypatch.setenv("CIRRON_METRICS", "false")
    assert ci.profile(output="none").settings.metrics is False
    ci.shutdown()
    monkeypatch.setenv("CIRRON_METRICS", "maybe")
    monkeypatch.setenv("CIRRON_METRICS_INTERVAL", "0.5")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        settings = ci.profile(output="none").settings
    assert settings.metrics is True and settings.metrics_interval == 0.5
    assert any("CIRRON_METRICS='maybe'" in r.getMessage() for r in caplog.records)
    with pytest.raises(TypeError, match="metrics"):
        ci.profile(metrics="yes")


def test_the_sampler_stops_with_the_profiler():
    ci.profile(output="none", config={"metrics_interval": 0.05})
    time.sleep(0.5)
    assert SAMPLER_THREAD in {t.name for t in threading.enumerate()}
    ci.shutdown()
    assert SAMPLER_THREAD not in {t.name for t in threading.enumerate()}
    samples = ci.metrics(format="dict")
    assert len(samples["process.memory.usage"]["points"]) >= 3
    assert {p["attributes"]["cpu.mode"] for p in samples["process.cpu.time"]["points"]} == {
        "user",
        "system",
    }
    utilization = [p["value"] for p in samples["process.cpu.utilization"]["points"]]
    assert utilization and all(0 <= value <= 1.5 for value in utilization)


def test_the_sampler_reads_proc_else_psutil_else_getrusage(monkeypatch):
    reader = ProcessReader()  # Linux: /proc/self/statm, kept open
    assert reader.source == "proc" and reader.rss() > 10_000_000
    assert reader.cpu_times()[0] > 0

    def no_proc(path, *args, **kwargs):
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "open", no_proc)  # macOS, Windows
    assert ProcessReader().source == "psutil" and ProcessReader().rss() > 10_000_000
    monkeypatch.setitem(sys.modules, "psutil", None)  # and no psutil: import psutil fails
    reader = ProcessReader()
    assert reader.source == "getrusage" and reader.rss() > 10_000_000  # the peak


@pytest.mark.slow
def test_the_sampler_costs_under_half_a_percent_of_a_core_at_one_second():
    sampler = SystemSampler(1.0, lambda sample: None, Health())
    sampler.start()
    time.sleep(10.2)
    sampler.stop(2.0)
    assert sampler.samples >= 10
    assert sampler.cpu_ns / 10.2e9 < 0.005, f"{sampler.cpu_ns / 1e6:.1f} ms of CPU in 10 s"


# -- the spool ------------------------------------------------------------------------------


def test_the_spool_writes_otlp_json_metrics_files_with_hex_exemplar_ids(tmp_path):
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    ci.profile()  # the spool, by default
    for _ in ci.batches(range(3)):
        ci.mark("loss", 0.5)
    ci.shutdown()
    spooled = {span["spanId"] for span in ci.spool_spans(str(tmp_path / ".cirron"))}
    names = metrics_files(str(tmp_path / ".cirron"))
    assert names and all("/.cirron/metrics/" in name for name in names)
    exemplar_ids = []
    for name in names:
        request = json.loads(Path(name).read_text())
        for resource_metrics in request["resourceMetrics"]:
            for scope_metrics in resource_metrics["scopeMetrics"]:
                for metric in scope_metrics["metrics"]:
                    for kind in ("gauge", "sum", "histogram"):
                        for point in metric.get(kind, {}).get("dataPoints", []):
                            for exemplar in point.get("exemplars", []):
                                exemplar_ids.append(exemplar["spanId"])
                                # OTLP/JSON's hex; protobuf's JSON would want base64
                                for key in ("traceId", "spanId"):
                                    exemplar[key] = base64.b64encode(
                                        bytes.fromhex(exemplar[key])
                                    ).decode()
        ParseDict(request, ExportMetricsServiceRequest())  # valid OTLP, every field
    assert exemplar_ids and set(exemplar_ids) <= spooled
    points = read_metrics(str(tmp_path / ".cirron"))
    (loss,) = [p for p in points if p["name"] == "loss"]
    assert loss["count"] == 3 and loss["value"] == 0.5 and loss["kind"] == "histogram"
    assert {e["span_id"] for e in loss["exemplars"]} <= spooled
    assert any(p["name"] == "process.memory.usage" and p["value"] > 0 for p in points)


def test_ci_flush_writes_the_metrics_recorded_so_far(tmp_path):
    ci.profile()
    for _ in ci.batches(range(2)):
        ci.mark("loss", 0.5)
    assert ci.flush() is True
    assert [p["count"] for p in read_metrics(str(tmp_path / ".cirron")) if p["name"] == "loss"] == [
        2
    ]


# -- where metrics go -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def metrics_receiver(tmp_path_factory):
    """rotel printing the traces and the metrics (with their exemplars) it receives."""
    rotel = OtlpReceiver(str(tmp_path_factory.mktemp("rotel")), debug_log=("traces", "metrics"))
    rotel.start()
    try:
        yield rotel
    finally:
        rotel.stop()


def _exemplar_span_ids(points: list[dict], name: str, service: str) -> set[str]:
    return {
        exemplar["span_id"]
        for point in points
        if point["name"] == name and point["resource"].get("service.name") == service
        for exemplar in point["exemplars"]
    }


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_real_otlp_receiver_gets_metrics_with_exemplars_whose_span_ids_are_in_the_trace(
    tmp_path, metrics_receiver, protocol
):
    endpoint = (
        metrics_receiver.grpc_endpoint if protocol == "grpc" else metrics_receiver.http_endpoint
    )
    service = f"metrics-{protocol.replace('/', '-')}"
    run_script(
        tmp_path,
        "import cirron as ci\nci.profile(output='none')\n" + textwrap.dedent(TORCH_LOOP),
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_SERVICE_NAME=service,
    )
    spans = metrics_receiver.wait_for_spans(
        lambda spans: any(s["resource"].get("service.name") == service for s in spans), 30
    )
    steps = {s["span_id"] for s in spans if s["name"] == "step"}
    metrics_receiver.wait_for(lambda text: service in text and "cirron.step.duration" in text, 30)
    points = metrics_receiver.metrics()
    loss = _exemplar_span_ids(points, "loss", service)
    assert loss and loss <= steps
    assert _exemplar_span_ids(points, "cirron.step.duration", service) <= steps
    assert {p["name"] for p in points if p["resource"].get("service.name") == service} >= {
        "loss", "cirron.steps", "cirron.epochs", "cirron.step.duration", "cirron.step.time",
        "process.cpu.time",
        "process.memory.usage", "cirron.step.memory.usage",
    }  # fmt: skip


PROGRAM_PROVIDER = """
    import json, math
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider, {filter}
    from opentelemetry.sdk.metrics.export import (
        MetricExporter, MetricExportResult, PeriodicExportingMetricReader,
    )

    class Keep(MetricExporter):  # the program's own exporter: keeps what it is given
        exported = []
        def export(self, metrics_data, timeout_millis=10_000, **kwargs):
            self.exported.append(metrics_data)
            return MetricExportResult.SUCCESS
        def force_flush(self, timeout_millis=10_000):
            return True
        def shutdown(self, timeout_millis=30_000, **kwargs):
            pass

    reader = PeriodicExportingMetricReader(Keep(), export_interval_millis=math.inf)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader], exemplar_filter={filter}()))
    import cirron as ci
    ci.profile(output="none")
    for _ in ci.batches(range(3)):
        ci.mark("loss", 0.5)
    ci.flush()
    found = {{}}
    for data in Keep.exported:
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, 0)
                    found[metric.name] += sum(len(p.exemplars) for p in metric.data.data_points)
    print(json.dumps(found))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("exemplar_filter", "exemplars"),
    [("TraceBasedExemplarFilter", True), ("AlwaysOffExemplarFilter", False)],
)
def test_a_programs_meter_provider_receives_cirrons_instruments(
    tmp_path, exemplar_filter, exemplars
):
    output = run_script(tmp_path, PROGRAM_PROVIDER.format(filter=exemplar_filter))
    found = json.loads(output.strip().splitlines()[-1])
    assert {"loss", "cirron.steps", "cirron.step.duration", "process.memory.usage"} <= set(found)
    assert (found["loss"] > 0) is exemplars
    assert "Traceback" not in output


@pytest.mark.slow
def test_zero_code_with_otel_metrics_exporter_otlp_sends_cirrons_metrics(
    tmp_path, metrics_receiver
):
    output = run_script(  # the script imports cirron for its marks only: no ci.profile()
        tmp_path,
        TORCH_LOOP + "    print('PROVIDERS', *ci.health()['metrics']['providers'])\n",
        instrument=True,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=metrics_receiver.http_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_SERVICE_NAME="metrics-zero-code",
    )
    spans = metrics_receiver.wait_for_spans(
        lambda spans: any(s["resource"].get("service.name") == "metrics-zero-code" for s in spans),
        30,
    )
    steps = {s["span_id"] for s in spans if s["name"] == "step"}
    metrics_receiver.wait_for(
        lambda text: "metrics-zero-code" in text and "cirron.step.duration" in text, 30
    )
    loss = _exemplar_span_ids(metrics_receiver.metrics(), "loss", "metrics-zero-code")
    assert loss and loss <= steps
    assert "PROVIDERS program cirron" in output  # the configurator's, and the spool's own
    assert metrics_files(str(tmp_path / ".cirron"))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (none here)")
def test_on_a_gpu_the_device_is_sampled_and_each_step_has_its_cuda_peak():
    import torch

    ci.profile(output="none", frameworks=["torch"], config={"metrics_interval": 0.2})
    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    until = time.monotonic() + 1.5
    while time.monotonic() < until:  # busy for a while: the sampler sees the GPU at work
        optimizer.zero_grad()
        model(torch.randn(512, 1024, device="cuda")).square().mean().backward()
        optimizer.step()
        ci.mark("loss", 0.5)
    torch.cuda.synchronize()
    ci.shutdown()
    found = ci.metrics(format="dict")
    limit = found["hw.gpu.memory.limit"]["points"]
    assert limit and all(p["value"] > 1 << 30 for p in limit)  # more than a GiB: a real card
    assert {"hw.id", "hw.name", "hw.vendor"} <= set(limit[0]["attributes"])
    assert max(p["value"] for p in found["hw.gpu.utilization"]["points"]) > 0
    assert found["hw.gpu.memory.usage"]["points"]
    peaks = found["cirron.step.cuda.memory.peak_allocated"]["points"]
    assert peaks and all(p["value"] >= 4 << 20 for p in peaks)  # the 4 MB weight at least


def _step_figures(batches: list[list]) -> list[tuple]:
    """The rows a metrics sink of its own records from ``batches`` of ended spans."""
    from cirron.metrics.from_spans import SpanMetrics
    from cirron.metrics.instruments import Instruments
    from cirron.metrics.recorded import Recorded
    from cirron.otel import semconv

    recorded = Recorded()
    instruments = Instruments([], recorded, Health())
    instruments.histogram(semconv.STEP_DURATION, "s", "", [])
    instruments.summed_counter(semconv.STEP_TIME, "s", "")
    instruments.summed_counter(semconv.STEP_COUNT, "{step}", "")
    sink = SpanMetrics(instruments, None, Health())
    for batch in batches:
        sink.export(batch)
    sink.flush()
    return [(row.name, row.value, dict(row.attributes), row.span_id) for row in recorded.snapshot()]


def test_a_step_counts_a_forward_that_reaches_the_sink_a_batch_late_and_out_of_order():
    # A forward whose GPU time was not known yet reaches the sink a flush after its step,
    # here inside a scope of the user's, in batches whose spans are not in the order they
    # ended: the step's figures are those of its spans read in order, at once.
    profiler = ci.profile(output="none")
    for _ in range(4):
        with ci.scope("step"):
            with ci.scope("mine"), ci.scope("forward"):
                time.sleep(0.002)
            with ci.scope("backward"):
                time.sleep(0.001)
    ci.flush()
    spans = [s for s in profiler.recorder.store.ended_spans() if s.name != "cirron.session"]
    ci.shutdown()
    steps = [spans[position : position + 4] for position in range(0, len(spans), 4)]
    late, carried = [], []  # each step's forward (it ends first) in the next batch
    for forward, *rest in steps:
        late.append(list(reversed(rest)) + carried)
        carried = [forward]
    late.append(carried)
    expected = _step_figures([spans])
    assert _step_figures(late) == expected
    forward_times = [value for name, value, attributes, _ in expected
                     if attributes.get("cirron.step.part") == "forward"]  # fmt: skip
    assert len(forward_times) == 4 and min(forward_times) >= 0.002


def test_the_rows_kept_for_ci_metrics_leave_the_garbage_collector_alone():
    # A run keeps 25,000 rows for ci.metrics(); an object of the collector's per row, kept
    # alive, would bring its passes sooner, and every one that lived through two passes the
    # next full pass over torch's objects nearer.
    import gc

    from cirron.metrics.recorded import MAX_SETS, Recorded

    recorded = Recorded()
    part = {"cirron.step.part": "forward"}
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for step in range(200):
            recorded.add("cirron.step.time", step, 0.5, part, trace_id=7, span_id=step + 1)
            recorded.add("loss", step, 1.0 / (step + 1), {"tags": ["a", "b"]})  # a list value
            recorded.add("cirron.system.cpu", step, 3.0, {})
        recorded.add_many("cirron.step.time", 200, [(0.25, part), (0.75, {})], 7, 201)
        kept_alive = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert kept_alive < 20, kept_alive  # the new sets' pairs, not an object per row (602)
    assert len(recorded) == 602
    rows = recorded.snapshot()
    assert rows[-2:] == [("cirron.step.time", 200, 0.25, part, 7, 201),
                         ("cirron.step.time", 200, 0.75, {}, 7, 201)]  # fmt: skip
    assert rows[0] == ("cirron.step.time", 0, 0.5, part, 7, 1)
    assert rows[1].attributes == {"tags": ("a", "b")} and rows[2].attributes == {}
    assert len(recorded.sets) == 3

    # Past MAX_SETS distinct sets (a program's own attributes, unbounded), a row holds its own.
    many = Recorded()
    for index in range(MAX_SETS + 5):
        many.add("x", index, 1.0, {"index": index})
    assert len(many.sets) == MAX_SETS
    assert [row.attributes for row in many.snapshot()[-2:]] == [
        {"index": MAX_SETS + 3},
        {"index": MAX_SETS + 4},
    ]
