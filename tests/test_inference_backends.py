"""Inference spans in real backends: an OTLP collector (rotel), Arize Phoenix, and a zero-code run.

Each test runs ``tests/scripts/serve_llm.py`` (a prompt through ``@ci.inference`` and a tiny
GPT-2's ``generate``) as a real subprocess and reads what the backend received: rotel's
printed spans, Phoenix's REST API (``/v1/projects/default/spans``), cirron's spool.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import support
from cirron.exporters import spool_spans

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
BIN = Path(sys.executable).parent
GENERATE = "text_completion GPT2LMHeadModel"


def serve(directory: Path, *, instrument: bool = False, **environment: str) -> dict:
    """Run serve_llm.py: with ``ci.profile()``, or under ``opentelemetry-instrument`` with no
    profile call (``instrument``). Returns its line: the token counts transformers returned."""
    command = [str(BIN / "python"), str(SCRIPTS / "serve_llm.py")]
    command = [str(BIN / "opentelemetry-instrument"), *command] if instrument else [
        *command, "--profile"
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=directory,
        env=support.clean_environment(
            OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", **environment
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def by_name(spans: list[dict], name: str) -> dict:
    (span,) = [s for s in spans if s["name"] == name]
    return span


def test_inference_and_generate_spans_reach_a_real_otlp_receiver(receiver, tmp_path):
    counts = serve(
        tmp_path,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_SERVICE_NAME="serve-otlp",
        CIRRON_METRICS="false",
    )

    def mine(spans: list[dict]) -> list[dict]:
        return [s for s in spans if s["resource"].get("service.name") == "serve-otlp"]

    received = mine(
        receiver.wait_for_spans(lambda spans: any(s["name"] == GENERATE for s in mine(spans)))
    )
    generate, outer = by_name(received, GENERATE), by_name(received, "serve")
    assert generate["parent_id"] == outer["span_id"]
    found = generate["attributes"]
    assert found["gen_ai.operation.name"] == "text_completion"
    assert found["gen_ai.request.model"] == "GPT2LMHeadModel"
    assert found["gen_ai.usage.input_tokens"] == counts["input_tokens"]
    assert found["gen_ai.usage.output_tokens"] == counts["output_tokens"] == 5
    assert type(found["gen_ai.usage.output_tokens"]) is int
    assert found["gen_ai.response.finish_reasons"] == ["length"]
    assert outer["attributes"]["model.name"] == "GPT2LMHeadModel"
    assert outer["attributes"]["batch.size"] == 1
    forwards = [s for s in received if s["name"] == "forward"]
    assert len(forwards) == 5 and {s["parent_id"] for s in forwards} == {generate["span_id"]}


def test_a_zero_code_run_traces_the_inference_function_and_generate(tmp_path):
    counts = serve(
        tmp_path, instrument=True, OTEL_TRACES_EXPORTER="cirron_spool", CIRRON_METRICS="false"
    )
    spooled = spool_spans(str(tmp_path / ".cirron"))
    generate, outer = by_name(spooled, GENERATE), by_name(spooled, "serve")
    assert generate["parentSpanId"] == outer["spanId"]
    usage = {a["key"]: a["value"] for a in generate["attributes"]}
    assert usage["gen_ai.usage.output_tokens"] == {"intValue": str(counts["output_tokens"])}


# -- Arize Phoenix ---------------------------------------------------------------------------------
def _phoenix() -> str | None:
    """Phoenix's command: in .venv-phoenix (scripts/phoenix-venv.sh), else on the PATH."""
    installed = ROOT / ".venv-phoenix" / "bin" / "phoenix"
    return str(installed) if installed.exists() else shutil.which("phoenix")


@pytest.fixture(scope="module")
def phoenix_spans(tmp_path_factory) -> dict:
    """Phoenix started in a network namespace of its own, the script's spans sent to it over
    OTLP/HTTP, and what its REST API shows of them (tests/scripts/through_phoenix.py)."""
    phoenix = _phoenix()
    if phoenix is None:
        pytest.skip(
            "Arize Phoenix is not installed: `bash scripts/phoenix-venv.sh` installs it in "
            ".venv-phoenix (about a minute, 850 MB; not in .venv, whose pins it conflicts with)"
        )
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip: Phoenix runs in a network namespace of its own")
    directory = tmp_path_factory.mktemp("phoenix")
    result = subprocess.run(
        ["unshare", "-n", "--", sys.executable, str(SCRIPTS / "through_phoenix.py"), phoenix,
         str(directory)],
        env=support.clean_environment(),
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    if result.returncode != 0 and "unshare failed" in result.stderr:
        pytest.skip(f"no network namespace here: {result.stderr.strip()}")
    log = (
        (directory / "phoenix.log").read_text()[-3000:]
        if (directory / "phoenix.log").exists()
        else ""
    )
    assert result.returncode == 0, result.stderr[-3000:] + log
    return json.loads(result.stdout.splitlines()[-1])


def test_phoenix_shows_the_generate_span_as_an_llm_span_with_its_token_counts(phoenix_spans):
    counts, spans = phoenix_spans["run"], phoenix_spans["spans"]
    generate = by_name(spans, GENERATE)
    assert generate["span_kind"] == "LLM"
    found = generate["attributes"]
    assert found["llm.model_name"] == "GPT2LMHeadModel"
    assert found["llm.token_count.prompt"] == counts["input_tokens"]
    assert found["llm.token_count.completion"] == counts["output_tokens"] == 5
    assert found["llm.token_count.total"] == counts["input_tokens"] + 5
    assert json.loads(found["llm.invocation_parameters"]) == {"max_tokens": 5}
    assert generate["parent_id"] == by_name(spans, "serve")["context"]["span_id"]
