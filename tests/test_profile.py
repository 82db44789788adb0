from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from opentelemetry import trace

import cirron as ci
from cirron import config
from support import run_python


def test_profile_returns_a_handle_and_opens_the_session():
    profiler = ci.profile(output="none")
    assert isinstance(profiler, ci.Profiler)
    root = profiler.trace(format="dict")
    assert root["name"] == "cirron.session"
    assert root["end_ns"] is None
    assert set(root["attributes"]) >= {"framework", "device", "cuda_count", "mixed_precision"}
    assert ci.health()["enabled"] is True


def test_second_profile_call_warns_once_and_returns_the_same_handle(caplog):
    first = ci.profile(output="none")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        second = ci.profile(output="stdout", flush_interval=5)
    assert second is first
    assert sum("already called" in r.message for r in caplog.records) == 1


def test_shutdown_clears_it_so_the_next_profile_starts_fresh():
    first = ci.profile(output="none")
    with ci.scope("one"):
        pass
    session_one = first.trace(format="dict")["span_id"]
    ci.shutdown()
    second = ci.profile(output="none")
    assert second is not first
    root = second.trace(format="dict")
    assert root["span_id"] != session_one
    assert root["children"] == []
    assert ci.health()["spans_started"] == 1  # just the new session


def test_trace_after_shutdown_still_shows_the_last_session():
    ci.profile(output="none")
    with ci.scope("work"):
        pass
    ci.shutdown()
    root = ci.trace(format="dict")
    assert root["end_ns"] is not None
    assert [c["name"] for c in root["children"]] == ["work"]


def test_disabled_profiler_records_nothing_and_starts_no_thread(tmp_path):
    threads = threading.active_count()
    profiler = ci.profile(enabled=False, path=str(tmp_path / "out"))
    ran = []
    with ci.scope("x"):
        ran.append(1)
    for _ in ci.batches(range(3)):
        ci.mark("loss", 1.0)
    assert ran == [1]
    assert threading.active_count() == threads
    assert not (tmp_path / "out").exists()
    assert profiler.health()["enabled"] is False
    assert ci.health()["spans_started"] == 0
    assert ci.trace(format="dict") is None


def test_otel_sdk_disabled_is_the_same_as_enabled_false(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert ci.profile().health()["enabled"] is False


@pytest.mark.parametrize(
    ("arguments", "error", "text"),
    [
        ({"output": "disk"}, ValueError, "output.*'disk'"),
        ({"output": ["spool", "kafka"]}, ValueError, "output.*'kafka'"),
        ({"output": 3}, TypeError, "output"),
        (
            {"frameworks": ["pytorch"]},
            ValueError,
            "torch, tensorflow, lightning, trainloop, transformers",
        ),
        ({"snapshots": "everything"}, ValueError, "snapshots"),
        ({"sample_rate": 1.5}, ValueError, "sample_rate"),
        ({"flush_interval": 0}, ValueError, "flush_interval"),
        ({"flush_interval": "1s"}, TypeError, "flush_interval"),
        ({"enabled": "yes"}, TypeError, "enabled"),
        ({"config": ["a"]}, TypeError, "config"),
        ({"config": {"flush_interval": -1}}, ValueError, r"config\['flush_interval'\]"),
        ({"path": "a\0b"}, ValueError, "path must not contain a NUL"),
    ],
)
def test_bad_arguments_fail_before_anything_is_installed(arguments, error, text, tmp_path):
    threads = threading.active_count()
    with pytest.raises(error, match=text):
        ci.profile(**arguments)
    assert ci.health()["enabled"] is False
    assert threading.active_count() == threads
    assert not (tmp_path / ".cirron").exists()


def test_settings_resolve_argument_then_config_then_environment(monkeypatch):
    monkeypatch.setenv("CIRRON_FLUSH_INTERVAL", "7")
    monkeypatch.setenv("CIRRON_SAMPLE_RATE", "0.5")
    monkeypatch.setenv("CIRRON_OUTPUT", "log,stdout")
    settings = config.resolve(
        {"sample_rate": 0.2, "flush_interval": 3.0, "my_flag": True}, True, flush_interval=2.0
    )
    assert settings.flush_interval == 2.0  # argument
    assert settings.sample_rate == 0.2  # config=
    assert settings.output == ("log", "stdout")  # environment
    assert settings.snapshots == "stats"  # default
    assert settings.config["my_flag"] is True


def test_bad_environment_value_warns_and_uses_the_default(monkeypatch, caplog):
    monkeypatch.setenv("CIRRON_FLUSH_INTERVAL", "soon")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        settings = config.resolve(None, True)
    assert settings.flush_interval == 1.0
    assert any("CIRRON_FLUSH_INTERVAL" in r.message for r in caplog.records)


def test_config_flags_are_readable_from_the_handle():
    profiler = ci.profile(output="none", config={"debug_eval": True})
    assert profiler.config.get("debug_eval") is True
    assert profiler.config.get("missing", 5) == 5


def test_profile_sets_the_global_sdk_provider():
    ci.profile(output="none")
    with ci.scope("mine"):
        child = trace.get_tracer("other.lib").start_span("other")
        child.end()
    (mine,) = ci.trace(format="dict", name="mine")
    assert [c["name"] for c in mine["children"]] == ["other"]


SAMPLED_LOOP = """
    import sys, collections, torch
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
    import cirron as ci

    class DropNames(Sampler):
        def should_sample(self, parent, trace_id, name, kind=None, attributes=None, *rest):
            drop = name in sys.argv[1].split(",")
            return SamplingResult(Decision.DROP if drop else Decision.RECORD_AND_SAMPLE)

        def get_description(self):
            return "DropNames"

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=DropNames())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    ci.profile(output="none")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    for epoch in range(2):
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    ci.trace()
    health = ci.health()
    ci.shutdown()
    assert health["hook_errors"] == 0, health["errors_by_site"]
    print(sorted(collections.Counter(s.name for s in exporter.get_finished_spans()).items()))
"""


@pytest.mark.parametrize(
    ("dropped", "kept"),
    [
        ("step", [("data_load", 6), ("epoch", 2), ("forward", 4)]),
        ("epoch", [("cirron.session", 1), ("step", 4)]),
        ("cirron.session,epoch,step,forward,backward,optimizer_step,data_load", []),
    ],
    ids=["steps", "epochs", "everything"],
)
def test_a_sampler_that_drops_cirrons_spans_never_breaks_training_or_shutdown(
    tmp_path, dropped, kept
):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(SAMPLED_LOOP))
    result = subprocess.run(
        [sys.executable, str(script), dropped], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "failed" not in result.stderr, result.stderr
    counts = dict(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    assert all(counts.get(name) == count for name, count in kept), counts
    assert not set(dropped.split(",")) & set(counts)


def test_flushing_the_users_own_provider_gives_its_exporter_the_hook_spans_too(tmp_path):
    result = run_python(
        """
        import collections, torch
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import cirron as ci

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        ci.profile(output="none", flush_interval=60)  # nothing flushed on its own meanwhile
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        for x, y in torch.utils.data.DataLoader(data, batch_size=8):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        provider.force_flush()  # the user's own flush, as the SDK documents it
        print(sorted(collections.Counter(s.name for s in exporter.get_finished_spans()).items()))
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    counts = dict(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    assert counts["step"] >= 1
    assert counts["forward"] == counts["backward"] == counts["optimizer_step"] == 2
    assert counts["data_load"] >= 2


def test_an_existing_sdk_provider_is_reused_not_replaced(tmp_path):
    result = run_python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.resources import Resource
        import cirron as ci

        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "users-own"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

        ci.profile(output="spool")
        with ci.scope("step", index=0):
            ci.mark("loss", 0.5)
        ci.shutdown()
        assert trace.get_tracer_provider() is provider
        names = sorted(s.name for s in exporter.get_finished_spans())
        print(names)
        assert names == ["cirron.session", "step"]
        step = [s for s in exporter.get_finished_spans() if s.name == "step"][0]
        assert step.instrumentation_scope.name == "cirron"
        assert step.resource.attributes["service.name"] == "users-own"
        assert step.events[0].name == "loss"
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / ".cirron" / "spool").glob("*.json.gz"))) >= 1


def test_resource_attributes_from_the_environment(tmp_path):
    script = tmp_path / "my_training.py"
    script.write_text(
        "import cirron as ci\nci.profile(output='spool')\nwith ci.scope('s'):\n    pass\n"
    )
    env = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "CIRRON_RUN_ID": "run-42",
        "CIRRON_PIPELINE_ID": "pipe-7",
    }
    import subprocess
    import sys

    def run_and_read(extra):
        import os

        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("CIRRON_", "OTEL_"))
        }
        environment.update(env | extra)
        for path in (tmp_path / ".cirron" / "spool").glob("*.json*"):
            path.unlink()
        subprocess.run(
            [sys.executable, str(script)], env=environment, cwd=tmp_path, check=True, timeout=60
        )
        requests = ci.read_spool(str(tmp_path / ".cirron"))
        attributes = requests[0]["resourceSpans"][0]["resource"]["attributes"]
        return {a["key"]: next(iter(a["value"].values())) for a in attributes}

    first = run_and_read({})
    assert first["service.name"] == "my_training"
    assert first["cirron.rank"] == "1" and first["cirron.world_size"] == "4"  # OTLP/JSON ints
    assert first["cirron.run_id"] == "run-42"
    assert first["cirron.pipeline_id"] == "pipe-7"
    assert first["host.name"]
    assert int(first["process.pid"]) > 0
    second = run_and_read(
        {"OTEL_SERVICE_NAME": "trainer", "OTEL_RESOURCE_ATTRIBUTES": "team=vision"}
    )
    assert second["service.name"] == "trainer"
    assert second["team"] == "vision"
    # stable per run and rank, so a restarted rank keeps its identity
    assert second["service.instance.id"] == first["service.instance.id"]


def test_traceparent_makes_the_session_a_child_of_the_caller(tmp_path):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    result = run_python(
        """
        import cirron as ci, json
        ci.profile(output="none")
        print(json.dumps(ci.trace(format="dict")))
        """,
        env={"TRACEPARENT": f"00-{trace_id}-00f067aa0ba902b7-01"},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    root = json.loads(result.stdout)
    assert root["parent_id"] == "00f067aa0ba902b7"
    spool_free = not (tmp_path / ".cirron").exists()
    assert spool_free


@pytest.mark.parametrize(
    ("path", "error"), [(5, TypeError), (None, TypeError), (b"/tmp", TypeError), ("", ValueError)]
)
@pytest.mark.parametrize("read", [ci.read_spool, ci.spool_spans])
def test_reading_a_spool_from_a_bad_path_names_the_argument(read, path, error):
    with pytest.raises(error, match="^path must"):
        read(path)
