from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import cirron as ci
from cirron.exporters.sinks import SinkWorker
from cirron.otel.health import Health
from cirron.otel.processor import RingBufferSpanProcessor
from cirron.otel.store import TraceStore


class Collecting(SpanExporter):
    def __init__(self):
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class Failing(SpanExporter):
    def export(self, spans):
        raise ConnectionError("backend down")


class Hanging(SpanExporter):
    def __init__(self):
        self.release = threading.Event()

    def export(self, spans):
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


def pipeline(*exporters, capacity=16, interval=60.0):
    health = Health()
    workers = [SinkWorker(f"sink{i}", e, health) for i, e in enumerate(exporters)]
    processor = RingBufferSpanProcessor(TraceStore(100), health, workers, capacity, interval, 3.0)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider.get_tracer("test"), processor, health, workers


def make_spans(tracer, count):
    for i in range(count):
        tracer.start_span("s", attributes={"i": i}).end()


def test_full_ring_drops_and_counts_without_blocking_the_caller():
    collected = Collecting()
    tracer, processor, health, (sink,) = pipeline(collected, capacity=8)
    with processor._drain_lock:  # the flush thread is stuck for now
        started = time.perf_counter()
        make_spans(tracer, 20)
        assert time.perf_counter() - started < 1.0
        assert processor.buffer_used == 8
    processor.force_flush()
    report = health.snapshot()
    assert report["spans_dropped"] == 12
    assert report["spans_ended"] == 20
    assert report["spans_exported"] == 8
    assert (sink.exported, sink.dropped) == (8, 12)  # a span no sink got is every sink's loss
    assert [s.attributes["i"] for s in collected.spans] == list(range(8))
    processor.shutdown()


def test_what_any_sink_lost_is_dropped_once_and_exported_means_every_sink_delivered_it(caplog):
    fast, slow = Collecting(), Hanging()
    health = Health()
    workers = [SinkWorker("fast", fast, health), SinkWorker("slow", slow, health, max_queued=5)]
    processor = RingBufferSpanProcessor(TraceStore(100), health, workers, 64, 60.0, 3.0)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        for _ in range(3):  # the slow sink exports the first, queues the second, has no room
            make_spans(tracer, 8)
            processor._drain()
            deadline = time.monotonic() + 5
            while not workers[1]._in_flight and time.monotonic() < deadline:
                time.sleep(0.001)
        assert health.snapshot()["spans_dropped"] == 8
        slow.release.set()
        assert processor.force_flush()
    report = health.snapshot()
    assert (report["spans_exported"], report["spans_dropped"], report["spans_ended"]) == (
        16,
        8,
        24,
    )
    assert (workers[0].exported, workers[0].dropped) == (24, 0)
    assert (workers[1].exported, workers[1].dropped) == (16, 8)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "8 span(s) did not reach the slow sink: it can't keep up" in warning
    processor.shutdown()


def test_a_batch_two_sinks_lost_counts_once_in_spans_dropped():
    class Refusing(SpanExporter):
        def export(self, spans):
            return SpanExportResult.FAILURE

    tracer, processor, health, workers = pipeline(Failing(), Refusing(), Collecting())
    make_spans(tracer, 5)
    processor.force_flush()
    report = health.snapshot()
    assert (report["spans_dropped"], report["spans_exported"]) == (5, 0)
    assert [w.dropped for w in workers] == [5, 5, 0]
    assert report["export_errors"] == 2
    processor.shutdown()


def test_the_flush_thread_exports_without_being_asked():
    collected = Collecting()
    tracer, processor, _health, _ = pipeline(collected, interval=0.05)
    make_spans(tracer, 3)
    deadline = time.monotonic() + 5
    while len(collected.spans) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(collected.spans) == 3
    processor.shutdown()


def test_a_failing_exporter_is_counted_and_warned_once(caplog):
    collected = Collecting()
    tracer, processor, health, workers = pipeline(Failing(), collected)
    with caplog.at_level(logging.WARNING, logger="cirron"):
        for _ in range(3):
            make_spans(tracer, 2)
            processor.force_flush()
    report = health.snapshot()
    assert report["export_errors"] == 3
    assert "backend down" in report["last_export_error"]
    assert workers[0].dropped == 6 and workers[1].exported == 6  # the other sink is unaffected
    assert sum("backend down" in r.getMessage() for r in caplog.records) == 1
    processor.shutdown()


def test_a_hanging_exporter_delays_only_itself():
    hanging, collected = Hanging(), Collecting()
    tracer, processor, _health, workers = pipeline(hanging, collected)
    make_spans(tracer, 5)
    started = time.monotonic()
    assert processor.force_flush(timeout_millis=300) is False
    assert time.monotonic() - started < 2
    assert len(collected.spans) == 5
    started = time.monotonic()
    processor.shutdown(timeout=0.5)
    assert time.monotonic() - started < 2


def test_spool_files_are_named_by_pid_and_sequence_and_never_half_written():
    ci.profile(output="spool")
    for i in range(3):
        with ci.scope("s", index=i):
            pass
        ci.flush()
    files = sorted(os.listdir(".cirron/spool"))
    assert files == [f"{os.getpid()}-{n:06d}.json.gz" for n in (1, 2, 3)]
    umask = os.umask(0)
    os.umask(umask)
    mode = stat.S_IMODE(os.stat(f".cirron/spool/{files[0]}").st_mode)
    assert mode == 0o664 & ~umask  # never writable by others (cirron.exporters.files)
    assert ci.health()["spool_bytes"] == sum(os.path.getsize(f".cirron/spool/{f}") for f in files)


def test_spool_content_is_otlp_json():
    ci.profile(output="spool")
    with ci.scope("step", index=4, note="x"):
        ci.mark("loss", 0.5)
    ci.flush()
    (request,) = ci.read_spool()
    (resource_spans,) = request["resourceSpans"]
    (scope_spans,) = resource_spans["scopeSpans"]
    assert scope_spans["scope"] == {"name": "cirron", "version": ci.__version__}
    (span,) = scope_spans["spans"]
    assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
    assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
    assert re.fullmatch(r"[0-9a-f]{16}", span["parentSpanId"])
    assert span["kind"] == 1  # SPAN_KIND_INTERNAL
    assert int(span["endTimeUnixNano"]) > int(span["startTimeUnixNano"])
    assert {"key": "index", "value": {"intValue": "4"}} in span["attributes"]
    assert span["events"][0]["name"] == "loss"


def test_an_unwritable_spool_directory_never_breaks_training(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the spool directory should be")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        handle = ci.profile(output=["spool", "none"], path=str(blocker))
        for i in range(3):
            with ci.scope("s", index=i):
                pass
            ci.flush()
    report = ci.health()
    assert report["export_errors"] == 3
    assert report["sinks"]["spool"]["dropped"] == report["spans_dropped"] == 3
    with caplog.at_level(logging.WARNING, logger="cirron"):
        ci.shutdown()  # the metrics files, written beside the spool, fail too: counted
    assert handle.health()["metrics"]["file_errors"] >= 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "did not reach the spool sink" in warning and "NotADirectoryError" in warning
    assert len(ci.trace(format="dict", name="s")) == 3  # still readable in memory


def test_stdout_sink_prints_one_line_per_span(capsys):
    ci.profile(output="stdout")
    with ci.scope("epoch", index=0):
        ci.mark("lr", 0.001)
        ci.mark("epoch_loss", 0.52341, kind="summary")
    ci.flush()
    (line,) = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        r"\[cirron\] epoch\[0\] - \d+(\.\d+)?(ns|us|ms|s) "
        r"\{lr=0\.001, epoch_loss=0\.5234\}",
        line,
    ), line


def test_stdout_sink_prints_a_flush_in_the_order_the_spans_began(capsys):
    torch = pytest.importorskip("torch")
    ci.profile(output="stdout", frameworks=["torch"], flush_interval=60)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=8):
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()
    ci.shutdown()  # one flush: every span of the loop
    names = [line.split()[1] for line in capsys.readouterr().out.splitlines()]
    steps = [names.index("step[0]"), names.index("step[1]")]
    forwards = [i for i, name in enumerate(names) if name == "forward"]
    # each step's forward right after it, not every step first and the forwards after
    assert len(forwards) == 2 and steps[0] < forwards[0] < steps[1] < forwards[1], names


def test_log_sink_writes_to_the_cirron_trace_logger(caplog):
    with caplog.at_level(logging.INFO, logger="cirron.trace"):
        ci.profile(output="log")
        with ci.scope("batch", index=2):
            pass
        ci.flush()
    (record,) = [r for r in caplog.records if r.name == "cirron.trace"]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("[cirron] batch[2] - ")


def test_output_none_writes_nothing_but_trace_works(tmp_path):
    ci.profile(output="none")
    with ci.scope("quiet"):
        pass
    ci.flush()
    assert not (tmp_path / ".cirron").exists()
    assert ci.trace(format="dict", name="quiet")
    assert ci.health()["sinks"] == {}


@pytest.mark.parametrize("output", [["spool", "stdout"], ["spool", "log"]])
def test_list_output_fans_out_to_every_sink(output, capsys):
    ci.profile(output=output)
    with ci.scope("s"):
        pass
    ci.flush()
    report = ci.health()
    assert sorted(report["sinks"]) == sorted(output)
    assert all(sink["exported"] == 1 for sink in report["sinks"].values())


def test_a_burst_faster_than_a_local_sink_loses_nothing():
    class Slow(Collecting):
        def export(self, spans):
            time.sleep(0.002)  # slower than the spans come in
            return super().export(spans)

    slow = Slow()
    health = Health()
    sink = SinkWorker("spool", slow, health, max_queued=32, wait_for_room=1.0)
    processor = RingBufferSpanProcessor(TraceStore(100), health, [sink], 64, 60.0, 3.0)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    make_spans(provider.get_tracer("test"), 3000)
    processor.force_flush()
    assert health.snapshot()["spans_dropped"] == 0 and sink.dropped == 0
    assert [s.attributes["i"] for s in slow.spans] == list(range(3000))
    processor.shutdown()


def test_a_span_ended_by_several_threads_at_once_is_exported_once():
    # Plain OTel code may end a span from any thread: racing end() calls must
    # reach the processor once. Threads switch as often as CPython allows.
    import sys

    from cirron.recording import recorder
    from cirron.recording.scopes import _start_span

    ci.profile(output="none")
    rec = recorder.current
    spans = [_start_span(rec, f"job-{i}", {}, None, rec.session_context) for i in range(5000)]
    before = ci.health()["spans_ended"]
    start = threading.Barrier(4)

    def end_them_all():
        start.wait()
        for span in spans:
            span.end()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=end_them_all) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert ci.health()["spans_ended"] - before == len(spans)
    ended = [n["name"] for n in ci.trace(format="dict")["children"]]
    assert sorted(ended) == sorted(f"job-{i}" for i in range(5000))
