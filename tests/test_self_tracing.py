"""cirron's own exports never show up in the user's trace.

A program that instruments ``requests`` (``opentelemetry-instrumentation-requests``, as
``opentelemetry-instrument`` does for every installed instrumentation) and profiles with an
OTLP/HTTP endpoint: the OTLP exporter posts with ``requests``, and each of those posts would be
a ``POST`` span of the user's trace, exported in turn by the next post. Every export cirron makes
runs inside OpenTelemetry's suppress-instrumentation context, as the SDK's own processors do.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

import support
from cirron.exporters import spool_spans

pytestmark = pytest.mark.slow

SCRIPT = """
    import requests
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    RequestsInstrumentor().instrument()

    import cirron as ci

    ci.profile(flush_interval=0.1)
    for step in range(3):
        with ci.scope("step"):
            ci.mark("loss", 1.0 / (step + 1))
    ci.flush()  # one export now, the rest at exit: several POSTs to the collector
    with ci.scope("after_flush"):
        pass
    print("TRAINED")
"""


def test_exports_to_an_instrumented_requests_make_no_post_spans(tmp_path, receiver):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=support.clean_environment(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.http_endpoint),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spooled = spool_spans(str(Path(tmp_path) / ".cirron"))
    session = next(s for s in spooled if s["name"] == "cirron.session")
    # Everything the program made reached the collector...
    receiver.wait_for(lambda text: session["spanId"] in text, timeout=30)
    received = receiver.spans()
    mine = [s for s in received if s["trace_id"] == session["traceId"]]
    assert Counter(s["name"] for s in mine) == Counter(s["name"] for s in spooled)
    # ...and none of cirron's own posts is in it, in the spool or at the collector.
    assert Counter(s["name"] for s in spooled) == {"cirron.session": 1, "step": 3, "after_flush": 1}
    assert [s for s in received if s["name"] == "POST"] == []
