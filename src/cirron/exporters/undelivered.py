"""The spans of a spool an OTLP endpoint has not acknowledged: what ``cirron export`` would send.

The spool has every span; the endpoint's ledger (:mod:`cirron.exporters.ledger`)
has what it acknowledged, from the live ``otlp`` sink and from earlier exports.
The difference is what it is missing.
"""

from __future__ import annotations

from .ledger import Ledger
from .otlp import endpoint_configured, traces_endpoint
from .spool import spool_spans


def undelivered_spans(path: str = ".cirron", endpoint: str | None = None) -> set[tuple[str, str]]:
    """(trace id, span id) in hex of every span under ``path`` that ``endpoint`` has not
    acknowledged. ``endpoint``: the one the environment configures
    (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``) by default."""
    if endpoint is None:
        if not endpoint_configured():
            raise ValueError("endpoint: none given, and no OTLP endpoint is configured")
        endpoint = traces_endpoint()
    acknowledged = Ledger(path, endpoint).acknowledged()
    missing = set()
    for span in spool_spans(path):
        record = bytes.fromhex(span["traceId"]) + bytes.fromhex(span["spanId"])
        if record not in acknowledged:
            missing.add((span["traceId"], span["spanId"]))
    return missing
