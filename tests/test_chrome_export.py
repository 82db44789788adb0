"""``cirron export --format chrome``: the Chrome/Perfetto trace of real profiled runs.

What a user opening ``trace.json`` in Perfetto relies on: strict JSON whatever the run
recorded, one process per rank, tracks whose slices nest as a thread's do, and a file
that is either the new trace or the old one, never half of one.
"""

from __future__ import annotations

import collections
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from cirron.exporters import spool_files
from cirron.exporters.otlp_json_decoder import decode_request
from cirron.offline import chrome
from support import clean_environment, spool_text

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent

# The loss turns NaN in epoch 1 (a weight set to NaN, as a diverging run does); a scope
# records a NaN, an infinity in a tuple and a string no UTF-8 reader takes.
DIVERGING = """
    import torch
    import cirron as ci
    ci.profile()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    for epoch in ci.epochs(range(2)):
        for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8)):
            if epoch == 1 and step == 2:
                with torch.no_grad():
                    model.weight[0, 0] = float("nan")
            with ci.scope("augment", ratio=float("nan"), bounds=(0.0, float("inf")),
                          note="lone \\ud800 surrogate, \\x00 and \\"quotes\\"\\n"):
                pass
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss)
"""

# Snapshots finished on cirron's snapshot thread, and a thread of the user's whose scopes
# overlap the training loop's spans.
THREADED = """
    import threading
    import time
    import torch
    import cirron as ci
    ci.profile()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    ci.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))

    def prefetch():
        for index in range(3):
            with ci.scope("prefetch", index=index):
                time.sleep(0.004)

    for epoch in ci.epochs(range(2)):
        worker = threading.Thread(target=prefetch)
        worker.start()
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss)
            time.sleep(0.003)
        worker.join()
"""


def profiled_run(directory: Path, script: str, **extra: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(textwrap.dedent(script))
    result = subprocess.run(
        [str(BIN / "python"), "train.py"], cwd=directory, env=clean_environment(**extra),
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return directory


def export(directory: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "cirron"), "export", "--format", "chrome", "-o", str(out), "--run", "all"],
        cwd=directory, env=clean_environment(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def strict_json(text: str) -> Any:
    """``text`` parsed as strict JSON: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def exported(directory: Path, out: Path) -> list[dict[str, Any]]:
    result = export(directory, out)
    assert result.returncode == 0, result.stderr
    return strict_json(out.read_text())["traceEvents"]


def decoded_spans(directory: Path) -> list[Any]:
    """The run's spans as ``cirron`` reads them back from the spool."""
    spans = []
    for name in spool_files(str(directory / ".cirron")):
        spans += decode_request(json.loads(spool_text(Path(name))))
    return spans


def tracks(events: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    found = collections.defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            found[event["pid"], event["tid"]].append(event)
    return found


def track_names(events: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    return {
        (event["pid"], event["tid"]): event["args"]["name"]
        for event in events
        if event["ph"] == "M" and event["name"] == "thread_name"
    }


def overlaps(events: list[dict[str, Any]]) -> list[str]:
    """Slices that break a track's stack: each must end by the end of the one it starts in.

    Times are read as Perfetto reads them, whole nanoseconds (``llround(us * 1000)``).
    """
    broken = []
    for track, slices in tracks(events).items():
        open_ends: list[int] = []
        for event in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            start = round(event["ts"] * 1000)
            end = start + round(event["dur"] * 1000)
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if open_ends and end > open_ends[-1]:
                broken.append(f"{event['name']} on {track}")
            open_ends.append(end)
    return broken


def rebuilt(span: Any, **changes: Any) -> ReadableSpan:
    """``span`` with some fields changed, as another writer of the spool could leave it."""
    fields = dict(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes=span.attributes, events=span.events, links=span.links, kind=span.kind,
        status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )  # fmt: skip
    return ReadableSpan(**{**fields, **changes})


@pytest.fixture(scope="module")
def diverging(tmp_path_factory) -> Path:
    return profiled_run(tmp_path_factory.mktemp("diverging"), DIVERGING)


@pytest.fixture(scope="module")
def threaded(tmp_path_factory) -> Path:
    return profiled_run(tmp_path_factory.mktemp("threaded"), THREADED)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """Two ranks of one run, spooled into one directory."""
    directory = tmp_path_factory.mktemp("ranks")
    for rank in (0, 1):
        profiled_run(directory, THREADED, RANK=str(rank), CIRRON_RUN_ID="chrome-run")
    return directory


# -- strict JSON ------------------------------------------------------------------------------
def test_a_run_whose_loss_goes_nan_exports_strict_json(diverging, tmp_path):
    events = exported(diverging, tmp_path / "trace.json")
    augment = next(e for e in events if e["ph"] == "X" and e["name"] == "augment")
    assert augment["args"]["ratio"] == "NaN"
    assert augment["args"]["bounds"] == [0.0, "Infinity"]
    assert "surrogate" in augment["args"]["note"] and '"quotes"' in augment["args"]["note"]
    losses = [e["args"]["loss"] for e in events if e["ph"] == "C" and e["name"] == "loss"]
    assert len(losses) == 6  # the first 6 of 8 steps; NaN can't be drawn on a counter
    assert all(isinstance(value, float) for value in losses)


def test_the_loss_values_left_off_the_counter_are_counted_where_they_began(diverging, tmp_path):
    events = exported(diverging, tmp_path / "trace.json")
    (dropped,) = [e for e in events if e["ph"] == "i" and e["name"] == chrome.NON_FINITE_MARKS]
    assert dropped["args"] == {"loss": 2}
    last_drawn = max(e["ts"] for e in events if e["ph"] == "C" and e["name"] == "loss")
    assert dropped["ts"] > last_drawn  # where the loss went NaN


# -- tracks ---------------------------------------------------------------------------------
def test_slices_nest_on_every_track_when_threads_overlap(threaded, tmp_path):
    events = exported(threaded, tmp_path / "trace.json")
    assert overlaps(events) == []
    names = track_names(events)
    holds = {names[track]: {e["cat"] for e in slices} for track, slices in tracks(events).items()}
    assert {"cirron.session", "epoch", "step", "forward"} <= holds["training"]
    assert holds["overlapping prefetch"] == {"prefetch"}  # the user's thread
    assert holds["snapshot"] == {"snapshot"}  # the snapshot thread


def test_snapshots_stay_instant_events_and_marks_counters(threaded, tmp_path):
    events = exported(threaded, tmp_path / "trace.json")
    assert sum(e["ph"] == "i" and e["name"] == "snapshot" for e in events) == 2
    assert sum(e["ph"] == "C" and e["name"] == "loss" for e in events) == 8


def test_a_parent_comes_before_its_children_at_the_same_time(threaded, tmp_path):
    """In time order on each track (the format asks no more: a viewer sorts what it reads,
    and keeps the file's order at equal times, which says who nests in whom)."""
    events = exported(threaded, tmp_path / "trace.json")
    for slices in tracks(events).values():
        times = [(e["ts"], -e["dur"]) for e in slices]
        assert times == sorted(times)
    step = next(e for e in events if e["ph"] == "X" and e["name"] == "step[0]")
    (data_load,) = [  # the step's batch fetch begins with it
        e for e in events if e["ph"] == "X" and e["name"] == "data_load" and e["ts"] == step["ts"]
    ]
    assert events.index(step) < events.index(data_load)


def test_a_span_that_never_ended_lasts_to_its_process_end(threaded):
    spans = decoded_spans(threaded)
    session = next(s for s in spans if s.name == "cirron.session")
    epoch = next(s for s in spans if s.name == "epoch" and s.attributes["index"] == 1)
    killed_at = (epoch.start_time + epoch.end_time) // 2
    killed = [  # as if the process was killed in epoch 1: its epoch and session never ended
        rebuilt(s, end_time=None) if s in (session, epoch) else s
        for s in spans
        if s.end_time <= killed_at or s in (session, epoch)
    ]
    events = chrome.chrome_events(killed)
    ended = [
        e for e in events if e["ph"] == "X" and e["name"] not in ("cirron.session", "epoch[1]")
    ]
    latest = max(e["ts"] + e["dur"] for e in ended)
    for name in ("cirron.session", "epoch[1]"):
        (open_span,) = [e for e in events if e["ph"] == "X" and e["name"] == name]
        assert open_span["ts"] + open_span["dur"] == pytest.approx(latest, abs=0.001)
        assert open_span["args"][chrome.UNFINISHED] is True
    assert overlaps(events) == []


def test_a_span_named_by_something_else_than_text_is_exported_named(threaded, tmp_path):
    spans = [rebuilt(s, name=42) if s.name == "prefetch" else s for s in decoded_spans(threaded)]
    chrome.write(spans, str(tmp_path / "trace.json"))
    events = strict_json((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("cat") == "42"} == {"42[0]", "42[1]", "42[2]"}


# -- processes ------------------------------------------------------------------------------
def test_two_ranks_are_two_processes_each_with_its_tracks(two_ranks, tmp_path):
    events = exported(two_ranks, tmp_path / "trace.json")
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert sorted(name.split(" (")[0] for name in processes.values()) == ["rank 0", "rank 1"]
    assert all(f"(pid {pid})" in name for pid, name in processes.items())
    training = [track for track, name in track_names(events).items() if name == "training"]
    assert sorted(pid for pid, _ in training) == sorted(processes)
    assert overlaps(events) == []


def test_the_same_pid_on_two_hosts_stays_two_processes(two_ranks, tmp_path):
    """A two-node run: each rank was pid 4242 on its own host."""
    copy = tmp_path / "nodes"
    (copy / ".cirron" / "spool").mkdir(parents=True)
    for name in spool_files(str(two_ranks / ".cirron")):
        request = json.loads(spool_text(Path(name)))
        for resource_spans in request["resourceSpans"]:
            attributes = resource_spans["resource"]["attributes"]
            rank = next(a["value"]["intValue"] for a in attributes if a["key"] == "cirron.rank")
            for attribute in attributes:
                if attribute["key"] == "process.pid":
                    attribute["value"] = {"intValue": "4242"}
                if attribute["key"] == "host.name":
                    attribute["value"] = {"stringValue": f"node{rank}"}
        (copy / ".cirron" / "spool" / os.path.basename(name)).write_text(json.dumps(request))
    events = exported(copy, tmp_path / "trace.json")
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert sorted(processes.values()) == [
        "rank 0 (pid 4242 on node0)",
        "rank 1 (pid 4242 on node1)",
    ]
    assert len({e["pid"] for e in events if e["ph"] == "X" and e["cat"] == "cirron.session"}) == 2
    assert overlaps(events) == []


# -- the file -------------------------------------------------------------------------------
def test_a_failed_export_leaves_the_previous_file_and_no_temporary_one(
    threaded, tmp_path, monkeypatch
):
    spans = decoded_spans(threaded)
    trace = tmp_path / "trace.json"
    trace.write_text('{"traceEvents": []}')

    def disk_full(trace: Any, out: Any) -> None:
        out('{"name": "process_name"')  # half a document, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chrome._Trace, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        chrome.write(spans, str(trace))
    assert trace.read_text() == '{"traceEvents": []}'
    assert os.listdir(tmp_path) == ["trace.json"]


def test_the_trace_is_readable_as_any_file_the_user_writes(threaded, tmp_path):
    previous = os.umask(0o022)
    try:
        events = exported(threaded, tmp_path / "trace.json")
    finally:
        os.umask(previous)
    assert events
    assert stat.S_IMODE((tmp_path / "trace.json").stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["trace.json"]


# -- a long run streams ---------------------------------------------------------------------
def laid_out(events: list[dict[str, Any]]) -> collections.Counter[str]:
    """The events, each with its track's name for its tid (the numbers may differ)."""
    names = track_names(events)
    found: collections.Counter[str] = collections.Counter()
    for event in events:
        if event["ph"] != "M" and "tid" in event:
            event = dict(event, tid=names[event["pid"], event["tid"]])
        found[json.dumps(event, sort_keys=True)] += 1
    return found


def respooled(directory: Path, into: Path, late: set[str]) -> Path:
    """The run's spool rewritten in two files: the spans named in ``late`` in the second, as
    the processor writes spans that waited for their GPU time, after their parents."""
    # (One file, or more where a flush came during the run: a busy machine's run is slower.)
    requests = [json.loads(spool_text(Path(f))) for f in spool_files(str(directory / ".cirron"))]
    request = requests[0]
    spans = [s for each in requests for s in each["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    folder = into / ".cirron" / "spool"
    folder.mkdir(parents=True)
    for number, part in enumerate(
        ([s for s in spans if s["name"] not in late], [s for s in spans if s["name"] in late]), 1
    ):
        request["resourceSpans"][0]["scopeSpans"][0]["spans"] = part
        (folder / f"77-{number:06d}.json").write_text(json.dumps(request))
    return into


def test_spans_written_after_their_parent_are_laid_out_as_if_in_order(threaded, tmp_path):
    late = respooled(threaded, tmp_path / "late", {"forward", "backward", "data_load"})
    streamed = exported(late, tmp_path / "trace.json")
    assert overlaps(streamed) == []
    assert laid_out(streamed) == laid_out(chrome.chrome_events(decoded_spans(threaded)))
    names = track_names(streamed)
    forwards = [e for e in streamed if e["ph"] == "X" and e["cat"] == "forward"]
    assert forwards and {names[e["pid"], e["tid"]] for e in forwards} == {"training"}


def test_a_trace_past_what_memory_holds_goes_through_a_scratch_file(
    threaded, tmp_path, monkeypatch
):
    """The same trace, its event text moved to the scratch file a few hundred bytes at a
    time and read back a few bytes at a time."""
    whole = exported(threaded, tmp_path / "whole.json")
    monkeypatch.setattr(chrome, "_HELD", 300)
    monkeypatch.setattr(chrome, "_READ", 64)
    problems: list[Any] = []
    spool = str(threaded / ".cirron")
    first = min(span.start_time for span in decoded_spans(threaded))
    (resource,) = {span.resource for span in decoded_spans(threaded)}
    count = chrome.write_spool(
        spool_files(spool), [(resource.attributes, first)], first, str(tmp_path / "small.json"),
        problems.append,
    )  # fmt: skip
    assert problems == [] and count == len(decoded_spans(threaded))
    assert strict_json((tmp_path / "small.json").read_text())["traceEvents"] == whole
    assert sorted(os.listdir(tmp_path)) == ["small.json", "whole.json"]  # no scratch file left


# -- parsed in a worker process -------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """The benchmark's synthetic run of 5,000 steps: three spool files and their index."""
    from benchmarks.long_runs import write_spool

    folder = tmp_path_factory.mktemp("synthetic")
    write_spool(folder / ".cirron", 5000)
    return folder


def test_files_parsed_in_a_worker_give_the_trace_read_in_one_process(
    synthetic, tmp_path, monkeypatch
):
    """The export parses spool files in a worker process; where none can be made (here:
    forking refused) it reads them itself, to the same trace, and no process is left."""
    import multiprocessing

    assert len(spool_files(str(synthetic / ".cirron"))) == 3
    worked = exported(synthetic, tmp_path / "worked.json")

    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.ForkContext, "Pool", refused)
    alone = tmp_path / "alone.json"
    written = chrome.write_spool(*synthetic_arguments(synthetic), str(alone), print)
    assert written == 5000 * 5 + 5 + 1  # steps and their parts, the epochs, the session
    assert laid_out(strict_json(alone.read_text())["traceEvents"]) == laid_out(worked)
    assert multiprocessing.active_children() == []
    assert sorted(os.listdir(tmp_path)) == ["alone.json", "worked.json"]


def test_an_error_in_the_worker_ends_the_export_and_the_worker(synthetic, tmp_path, monkeypatch):
    import multiprocessing

    def broken(name: str) -> Any:
        raise MemoryError(f"parsing {os.path.basename(name)}")

    monkeypatch.setattr(chrome.spool_reader, "span_lines", broken)  # (the worker's too)
    with pytest.raises(MemoryError, match="parsing 1000-000001"):
        chrome.write_spool(*synthetic_arguments(synthetic), str(tmp_path / "t.json"), print)
    assert multiprocessing.active_children() == []
    assert os.listdir(tmp_path) == []  # no trace, no scratch file


def synthetic_arguments(folder: Path) -> tuple[list[str], list[Any], int]:
    """What ``cirron export`` hands ``chrome.write_spool`` for the synthetic run."""
    text = (folder / ".cirron" / "index" / "1000.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    start = min(line["start"] for line in lines)  # (the session's, in the last file)
    return spool_files(str(folder / ".cirron")), [(lines[0]["resource"], start)], start
