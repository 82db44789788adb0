"""The end of a run, whoever made the tracer provider: signals, exit, and how long exit takes.

Under ``opentelemetry-instrument`` the spans reach the spool (and OTLP) through the SDK's
``BatchSpanProcessor`` that the OTel configurator made, not through cirron's sinks. SIGTERM
flushes it within ``exit_timeout`` as ``ci.profile()`` flushes its own, and the signal then does
what it would have done; at exit, an exporter still retrying against an unreachable endpoint is
given up on after ``exit_timeout``, as cirron's own OTLP sink is. Every test runs the user's
program as a real subprocess.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

import support
from cirron.exporters import spool_spans

try:
    from otlp_receiver import free_port
except ImportError:  # pragma: no cover - run from the repository root
    from tests.otlp_receiver import free_port

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent

TORCH_LOOP = support.TINY_TORCH_LOOP
# The loop, then a wait for the signal (saving a checkpoint, evaluating, ...).
UNTIL_KILLED = (
    TORCH_LOOP
    + """
    open("trained", "w").close()
    import time
    time.sleep(120)
"""
)


def environment(**extra: str) -> dict[str, str]:
    # PYTHONFAULTHANDLER: a child that does not end says where each of its threads is (below).
    chosen = {"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", **extra}
    return support.clean_environment(PYTHONFAULTHANDLER="1", **chosen)


def start(directory: Path, code: str, command: list[str], **extra: str) -> subprocess.Popen[str]:
    (directory / "train.py").write_text(textwrap.dedent(code))
    return subprocess.Popen(
        command,
        cwd=directory,
        env=environment(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, process: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"exited ({process.returncode}): {process.communicate()[0]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out: {process.communicate()[0]}")
        time.sleep(0.05)


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        raise AssertionError(f"did not end within {timeout}s: {output}") from None
    return process.returncode, output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_zero_code_training_script_sent_a_signal_after_its_loop_keeps_its_steps(tmp_path, signum):
    instrument = [str(BIN / "opentelemetry-instrument"), str(BIN / "python"), "train.py"]
    process = start(tmp_path, UNTIL_KILLED, instrument, OTEL_TRACES_EXPORTER="cirron_spool")
    wait_for((tmp_path / "trained").exists, process)
    process.send_signal(signum)
    returncode, output = finish(process)
    # Died by the signal, as without cirron (Python ends by SIGINT after a KeyboardInterrupt).
    assert returncode == -signum, output
    spans = spool_spans(str(tmp_path / ".cirron"))
    names = Counter(s["name"] for s in spans)
    assert names["step"] == 8 and names["epoch"] == 2, output
    (session,) = [s for s in spans if s["name"] == "cirron.session"]
    assert signal.Signals(signum).name in session["status"].get("message", "")


# The program's own provider, with a BatchSpanProcessor writing span names to a file.
OWN_PROVIDER = """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Lines(SpanExporter):
        def export(self, spans):
            with open("mine.txt", "a") as out:
                out.writelines(span.name + "\\n" for span in spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Lines(), schedule_delay_millis=60000))
    trace.set_tracer_provider(provider)
    import cirron as ci
    ci.profile()
    with trace.get_tracer("mine").start_as_current_span("load_data"):
        pass
"""


def test_sigterm_flushes_a_tracer_provider_the_program_made_itself(tmp_path):
    code = textwrap.dedent(OWN_PROVIDER) + textwrap.dedent(UNTIL_KILLED)
    process = start(tmp_path, code, [str(BIN / "python"), "train.py"])
    wait_for((tmp_path / "trained").exists, process)
    process.send_signal(signal.SIGTERM)
    returncode, output = finish(process)
    assert returncode == -signal.SIGTERM, output
    mine = Counter((tmp_path / "mine.txt").read_text().split())
    assert mine["load_data"] == 1 and mine["step"] == 8 and mine["cirron.session"] == 1


APP = """
    from fastapi import FastAPI
    from opentelemetry import trace

    app = FastAPI()
    tracer = trace.get_tracer("app")

    @app.get("/predict")
    def predict() -> dict:
        with tracer.start_as_current_span("predict"):
            return {"label": 1}
"""


def test_a_zero_code_fastapi_app_sent_sigterm_shuts_down_gracefully_and_keeps_its_spans(
    tmp_path,
):
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    port = free_port()
    process = start(
        tmp_path,
        "",
        [str(BIN / "opentelemetry-instrument"), str(BIN / "uvicorn"), "app:app",
         "--port", str(port)],
        OTEL_TRACES_EXPORTER="cirron_spool",
    )  # fmt: skip
    answer: list[bytes] = []

    def answered() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/predict", timeout=1) as reply:
                answer.append(reply.read())
            return True
        except OSError:
            return False

    wait_for(answered, process, timeout=60)
    assert answer == [b'{"label":1}']
    process.send_signal(signal.SIGTERM)
    returncode, output = finish(process)
    assert "Finished server process" in output  # uvicorn's graceful shutdown ran
    # uvicorn raises the signal again once it has shut down: it ends by SIGTERM, with or
    # without cirron.
    assert returncode == -signal.SIGTERM, output
    names = Counter(s["name"] for s in spool_spans(str(tmp_path / ".cirron")))
    assert names["predict"] == 1 and names["cirron.session"] == 1, names


def timed_run(directory: Path, command: list[str], code: str, **extra: str) -> float:
    directory.mkdir()
    began = time.monotonic()
    returncode, output = finish(start(directory, code, command, **extra), timeout=120)
    elapsed = time.monotonic() - began
    assert returncode == 0 and "TRAINED" in output, output
    assert Counter(s["name"] for s in spool_spans(str(directory / ".cirron")))["step"] == 8
    return elapsed


def test_zero_code_ends_about_as_soon_as_ci_profile_with_an_unreachable_endpoint(tmp_path):
    """Nothing listens at the endpoint: both give up on it after exit_timeout (3 s)."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    python = [str(BIN / "python"), "train.py"]
    profiled = timed_run(
        tmp_path / "profiled",
        python,
        "import cirron as ci\nci.profile()\n" + textwrap.dedent(TORCH_LOOP),
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
    )
    zero_code = timed_run(
        tmp_path / "zero_code",
        [str(BIN / "opentelemetry-instrument"), *python],
        TORCH_LOOP,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,  # and the distro's default: otlp, over gRPC
    )
    assert zero_code < profiled + 2.0, (zero_code, profiled)


# A span, a warning logged (a record for the logs exporter), and when the script ended. No
# torch: its teardown alone takes seconds on a loaded machine, more than what is measured here.
TRACED_AND_LOGGED = """
    import logging, time
    from opentelemetry import trace
    with trace.get_tracer("train").start_as_current_span("prepare"):
        sum(range(1000))
    logging.getLogger("train").warning("trained")
    print("ENDED", time.time(), flush=True)
"""


def test_zero_code_with_traces_metrics_and_logs_to_nobody_exits_within_the_exit_timeout(tmp_path):
    """The distro's defaults (traces, metrics and logs over OTLP) with nothing listening: the
    metrics and logs providers the configurator made are given up on at the same deadline as
    the traces, not after their own retries (~15 s more)."""
    process = start(
        tmp_path,
        TRACED_AND_LOGGED,
        [str(BIN / "opentelemetry-instrument"), str(BIN / "python"), "train.py"],
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED="true",
        CIRRON_EXIT_TIMEOUT="2",
    )
    returncode, output = finish(process, timeout=120)
    exited = time.time()
    assert returncode == 0, output
    ended = float(output.split("ENDED ", 1)[1].split()[0])
    assert exited - ended < 2 + 3, output  # the exit timeout, and the interpreter's ending
    assert "prepare" in {s["name"] for s in spool_spans(str(tmp_path / ".cirron"))}


def test_spans_printed_locally_with_metrics_to_nobody_get_one_line_not_a_retry_log(tmp_path):
    """``OTEL_TRACES_EXPORTER=cirron_stdout`` leaves metrics and logs on the distro's default,
    OTLP, with nothing listening: one line says so (and how to keep everything local)."""
    process = start(
        tmp_path,
        TRACED_AND_LOGGED,
        [str(BIN / "opentelemetry-instrument"), str(BIN / "python"), "train.py"],
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        OTEL_TRACES_EXPORTER="cirron_stdout",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="otlp",
        CIRRON_EXIT_TIMEOUT="2",
    )
    returncode, output = finish(process, timeout=120)
    assert returncode == 0 and "[cirron] prepare" in output, output
    failures = [line for line in output.splitlines() if "UNAVAILABLE" in line]
    assert len(failures) == 1 and "cirron: OTLP export failed" in failures[0], output
    assert "OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none" in failures[0]
