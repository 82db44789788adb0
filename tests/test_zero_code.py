"""Zero-code runs (``opentelemetry-instrument python train.py``) and one trace per run.

Every test runs real subprocesses: scripts that never import cirron, started
by ``opentelemetry-instrument``, exporting to a real OTLP receiver (rotel) and
to cirron's spool at once; ranks that share a run id; ``TRACEPARENT``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import support
from cirron.exporters import spool_spans
from support import HF_TINY_TRAINER, TINY_TORCH_LOOP

try:
    from otlp_receiver import OtlpReceiver
except ImportError:  # pragma: no cover - run from the repository root
    from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent

TORCH_LOOP = TINY_TORCH_LOOP

PROFILED_LOOP = "import cirron as ci\nci.profile()\n" + textwrap.dedent(TORCH_LOOP)


def clean_environment(**extra: str) -> dict[str, str]:
    """No OTEL_/CIRRON_/torchrun variables of ours; no metrics or logs exported."""
    environment = support.clean_environment(
        OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", **extra
    )
    return {k: v for k, v in environment.items() if not k.startswith("TORCHELASTIC_")}


def run(directory: Path, code: str, *, instrument: bool, **extra: str) -> str:
    script = directory / "train.py"
    script.write_text(textwrap.dedent(code))
    command = [str(BIN / "python"), str(script)]
    if instrument:
        command = [str(BIN / "opentelemetry-instrument"), *command]
    result = subprocess.run(
        command,
        cwd=directory,
        env=clean_environment(**extra),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRAINED" in result.stdout
    return result.stdout + result.stderr


def resource(span: dict, key: str) -> object:
    """A resource attribute of a spooled span, as its plain value."""
    for item in span["resource"]:
        if item["key"] == key:
            ((kind, value),) = item["value"].items()
            return int(value) if kind == "intValue" else value
    return None


def tree(spans: list[dict]) -> Counter:
    """(name, parent's name) of every span: the shape of a run."""
    names = {s["spanId"]: s["name"] for s in spans}
    return Counter((s["name"], names.get(s.get("parentSpanId", ""))) for s in spans)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> list[dict]:
    """The same loop with ci.profile() in it: the tree zero-code must give."""
    directory = tmp_path_factory.mktemp("profiled")
    run(directory, PROFILED_LOOP, instrument=False)
    return spool_spans(str(directory / ".cirron"))


def test_a_script_that_never_imports_cirron_gives_the_same_tree_over_otlp_and_spool(
    tmp_path, receiver, profiled
):
    output = run(
        tmp_path,
        TORCH_LOOP,
        instrument=True,
        OTEL_TRACES_EXPORTER="otlp,cirron_spool",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.http_endpoint + "/v1/traces",
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_BSP_SCHEDULE_DELAY="100",
        CIRRON_RUN_ID="zero-code-1",
    )
    spooled = spool_spans(str(tmp_path / ".cirron"))
    assert tree(spooled) == tree(profiled)
    assert Counter(s["name"] for s in spooled)["step"] == 8
    assert len({s["spanId"] for s in spooled}) == len(spooled)  # spooled once, not twice
    (session,) = [s for s in spooled if s["name"] == "cirron.session"]
    received = receiver.wait_for(lambda text: session["spanId"] in text, timeout=30)
    trace_ids = {s["traceId"] for s in spooled}
    assert len(trace_ids) == 1 and trace_ids.pop() in received
    assert "Attempting to instrument while already instrumented" not in output
    # The process is described as ci.profile() describes it: runs and ranks tell apart.
    assert resource(session, "service.name") == "train"  # the script's name
    assert resource(session, "cirron.run_id") == "zero-code-1"
    assert resource(session, "process.pid") and resource(session, "host.name")
    assert resource(session, "cirron.rank") is None  # (no rank in this environment)
    assert re.search(r"zero-code-1 .* torch +pid \d+ +8 +ok", cirron_runs(tmp_path))


def test_the_spans_of_other_instrumentations_carry_the_same_resource(tmp_path):
    """A tracer another instrumentation made before cirron's hook ran (requests') still
    describes the process as cirron does: one process in `cirron runs`, not two."""
    code = """
        import requests
        try:
            requests.get("http://127.0.0.1:9", timeout=1)  # refused: a failed GET span
        except requests.RequestException:
            pass
        print("TRAINED")
    """
    run(tmp_path, code, instrument=True, OTEL_TRACES_EXPORTER="cirron_spool", RANK="1")
    spans = spool_spans(str(tmp_path / ".cirron"))
    assert {s["name"] for s in spans} == {"GET", "cirron.session"}
    assert {resource(s, "cirron.rank") for s in spans} == {1}
    assert len({resource(s, "process.pid") for s in spans}) == 1
    # (The GET failed, and the program caught it and went on: the run did not fail.)
    assert re.search(r" rank 1 +0 +ok", cirron_runs(tmp_path))


def cirron_runs(directory: Path) -> str:
    result = subprocess.run(
        [str(BIN / "cirron"), "runs"], cwd=directory, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ci_profile_in_a_zero_code_run_reuses_its_provider_and_instrumentors(tmp_path, profiled):
    output = run(tmp_path, PROFILED_LOOP, instrument=True, OTEL_TRACES_EXPORTER="cirron_spool")
    spooled = spool_spans(str(tmp_path / ".cirron"))
    assert tree(spooled) == tree(profiled)  # one session, every span once
    assert len({s["spanId"] for s in spooled}) == len(spooled)
    assert "already called" not in output and "already instrumented" not in output


def test_disabling_the_torch_instrumentation_turns_its_spans_off(tmp_path):
    run(
        tmp_path,
        TORCH_LOOP,
        instrument=True,
        OTEL_TRACES_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="cirron_torch",
    )
    names = Counter(s["name"] for s in spool_spans(str(tmp_path / ".cirron")))
    assert names == {"cirron.session": 1}


def test_a_bad_cirron_variable_warns_and_falls_back(tmp_path):
    output = run(
        tmp_path,
        TORCH_LOOP,
        instrument=True,
        OTEL_TRACES_EXPORTER="none",
        CIRRON_SNAPSHOTS="everything",
        CIRRON_PATH=str(tmp_path / "here"),
    )
    assert "ignoring CIRRON_SNAPSHOTS='everything'" in output
    assert Counter(s["name"] for s in spool_spans(str(tmp_path / "here")))["step"] == 8


def test_cirron_enabled_false_turns_the_zero_code_profiler_off(tmp_path):
    run(tmp_path, TORCH_LOOP, instrument=True, OTEL_TRACES_EXPORTER="none", CIRRON_ENABLED="false")
    assert not (tmp_path / ".cirron").exists()


HF_SCRIPT = HF_TINY_TRAINER


def test_an_hf_trainer_script_zero_code_gives_the_trainers_tree(tmp_path):
    run(tmp_path, HF_SCRIPT, instrument=True, OTEL_TRACES_EXPORTER="none")
    spans = spool_spans(str(tmp_path / ".cirron"))
    shape = tree(spans)
    assert shape[("train", "cirron.session")] == 1
    assert shape[("epoch", "train")] == 2 and shape[("step", "epoch")] == 4
    assert shape[("forward", "step")] == 4 and shape[("snapshot", "epoch")] == 2


# -- one trace per run -------------------------------------------------------------------------
RANK_SCRIPT = """
    import cirron as ci
    ci.profile()
    with ci.scope("work"):
        pass
    print("TRAINED")
"""


def test_ranks_that_share_a_run_id_record_into_one_trace(tmp_path):
    for rank in (0, 1):
        directory = tmp_path / f"rank{rank}"
        directory.mkdir()
        run(directory, RANK_SCRIPT, instrument=False, CIRRON_RUN_ID="exp-42", RANK=str(rank))
    sessions = [
        s
        for rank in (0, 1)
        for s in spool_spans(str(tmp_path / f"rank{rank}" / ".cirron"))
        if s["name"] == "cirron.session"
    ]
    assert len({s["traceId"] for s in sessions}) == 1
    assert len({s["spanId"] for s in sessions}) == 2
    assert all(not s.get("parentSpanId") for s in sessions)  # each process's root
    assert sorted(resource(s, "cirron.rank") for s in sessions) == [0, 1]
    # another run, another trace
    other = tmp_path / "other"
    other.mkdir()
    run(other, RANK_SCRIPT, instrument=False, CIRRON_RUN_ID="exp-43")
    (session,) = [s for s in spool_spans(str(other / ".cirron")) if s["name"] == "cirron.session"]
    assert session["traceId"] != sessions[0]["traceId"]


def test_traceparent_wins_over_the_run_id(tmp_path):
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    run(
        tmp_path,
        RANK_SCRIPT,
        instrument=False,
        CIRRON_RUN_ID="exp-42",
        TRACEPARENT=f"00-{trace_id}-{parent_id}-01",
    )
    (session,) = [
        s for s in spool_spans(str(tmp_path / ".cirron")) if s["name"] == "cirron.session"
    ]
    assert (session["traceId"], session["parentSpanId"]) == (trace_id, parent_id)


DDP_SCRIPT = """
    import os
    import torch
    import torch.distributed as dist
    import cirron as ci
    ci.profile()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in ci.epochs(range(2)):
        for x in ci.batches([torch.randn(4, 4) for _ in range(3)]):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
    dist.destroy_process_group()
    print("TRAINED")
"""


def test_torchrun_ranks_record_into_one_trace_each_with_its_own_files(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(script)],
        cwd=tmp_path,
        env=clean_environment(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spans = spool_spans(str(tmp_path / ".cirron"))
    sessions = [s for s in spans if s["name"] == "cirron.session"]
    assert sorted(resource(s, "cirron.rank") for s in sessions) == [0, 1]
    assert len({s["traceId"] for s in spans}) == 1
    pids = {resource(s, "process.pid") for s in spans}
    files = {Path(f).name.split("-")[0] for f in os.listdir(tmp_path / ".cirron" / "spool")}
    assert len(pids) == 2 and files == {str(pid) for pid in pids}
    run_ids = {resource(s, "cirron.run_id") for s in sessions}
    assert len(run_ids) == 1 and None not in run_ids  # torchrun's --standalone rendezvous id


def test_two_hops_a_node_collector_forwarding_to_a_gateway_deliver_every_span_once(tmp_path):
    """cirron -> a collector on the node -> a gateway: the layout of a many-node run."""
    gateway = OtlpReceiver(str(tmp_path / "gateway")).start()
    try:
        node = OtlpReceiver(str(tmp_path / "node"), forward_to=gateway.grpc_endpoint).start()
        try:
            run(
                tmp_path,
                PROFILED_LOOP,
                instrument=False,
                OTEL_EXPORTER_OTLP_ENDPOINT=node.http_endpoint,
                CIRRON_RUN_ID="two-hops",
            )
            spooled = spool_spans(str(tmp_path / ".cirron"))
            expected = {s["spanId"] for s in spooled}
            gateway.wait_for(lambda text: all(i in text for i in expected), timeout=30)
            received = [s for s in gateway.spans() if s["span_id"] in expected]
            assert sorted(s["span_id"] for s in received) == sorted(expected)  # each once
        finally:
            node.stop()
    finally:
        gateway.stop()


def test_loading_the_entry_points_imports_no_framework(tmp_path):
    code = """
        import sys
        from importlib.metadata import entry_points
        for group in ("opentelemetry_instrumentor", "opentelemetry_traces_exporter",
                      "opentelemetry_post_instrument", "opentelemetry_environment_variables"):
            for entry_point in entry_points(group=group):
                if entry_point.name.startswith("cirron"):
                    entry_point.load()
        heavy = ("torch", "tensorflow", "keras", "tf_keras", "transformers", "lightning",
                 "pytorch_lightning", "trainloop", "sklearn")
        print("LOADED", sorted(m for m in heavy if m in sys.modules))
        print("TRAINED")
    """
    output = run(tmp_path, code, instrument=False)
    assert "LOADED []" in output
