"""Where spans go: the local sinks (``spool``, ``log``, ``stdout``) and OTLP, each an exporter
behind a sink worker of its own (``sinks``); the spool's files (``files``), the one reader of
them (``spool_reader``, which decodes with ``otlp_json_decoder``) and the one-line text form
of a span (``lines``). :data:`OUTPUTS` says, per output name, which exporter it
gets and how its worker treats it.

Each exporter is a standard OpenTelemetry ``SpanExporter``, so they also work
with a plain SDK ``BatchSpanProcessor``.

Metrics have two exporters here, each a standard ``MetricExporter`` behind an SDK metric
reader (:mod:`cirron.metrics` makes them): the spool's metrics files and their reader,
``read_metrics`` (``metrics_files``), and OTLP metrics by the traces' rules (``otlp_metrics``).

May import: :mod:`cirron.otel`, :mod:`cirron.config` (the settings), and modules of this
package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.sdk.trace.export import SpanExporter

from ..otel.health import Health
from .console import LogExporter, StdoutExporter
from .ledger import Ledger
from .otlp import endpoint_configured, otlp_exporter, protocol, traces_endpoint
from .sinks import SinkWorker
from .spool import SpoolExporter, ZeroCodeSpoolExporter, read_spool, spool_files, spool_spans
from .undelivered import undelivered_spans

__all__ = [
    "OUTPUTS",
    "LogExporter",
    "Output",
    "SpoolExporter",
    "StdoutExporter",
    "Ledger",
    "ZeroCodeSpoolExporter",
    "build_sinks",
    "sink_workers",
    "sinks_of",
    "endpoint_configured",
    "otlp_exporter",
    "read_spool",
    "spool_files",
    "spool_spans",
    "undelivered_spans",
]


@dataclass(frozen=True)
class Output:
    """One place spans can go: the exporter it gets, and how its sink worker treats it."""

    exporter: type[SpanExporter] | None  # None: built by the OTLP factory
    # (path, spool_max_bytes, spool_compression) -> exporter
    build: Callable[[str, int | None, str], SpanExporter]
    # Seconds a full queue is waited for: local sinks only behind a burst are waited for, the
    # network never is.
    wait_for_room: float


# Per output name (ci.profile(output=...), and "otlp" when an endpoint is configured).
OUTPUTS: dict[str, Output] = {
    "spool": Output(SpoolExporter, SpoolExporter, 1.0),
    "log": Output(LogExporter, lambda path, cap, compression: LogExporter(), 1.0),
    "stdout": Output(StdoutExporter, lambda path, cap, compression: StdoutExporter(), 1.0),
    "otlp": Output(None, lambda path, cap, compression: otlp_exporter(), 0.0),
}


def sinks_of(exporters: list[SpanExporter]) -> set[str]:
    """The local sinks among ``exporters`` (a provider's, set up by the OTel configurator)."""
    return {
        name
        for name, output in OUTPUTS.items()
        for exporter in exporters
        if output.exporter is not None and isinstance(exporter, output.exporter)
    }


def build_sinks(
    output: tuple[str, ...],
    path: str,
    otlp: bool,
    spool_max_bytes: int | None = None,
    spool_compression: str = "gzip",
) -> dict[str, SpanExporter]:
    """Exporters by sink name, for validated ``output`` names (``none`` removed)."""
    names = [name for name in output if name in OUTPUTS and name != "otlp"]
    sinks = {name: OUTPUTS[name].build(path, spool_max_bytes, spool_compression) for name in names}
    if otlp:
        sinks["otlp"] = OUTPUTS["otlp"].build(path, spool_max_bytes, spool_compression)
    return sinks


def sink_workers(
    sinks: dict[str, SpanExporter], path: str, max_queued: int, health: Health
) -> list[SinkWorker]:
    """A worker per sink. When the spool is on, what the OTLP endpoint acknowledges is noted
    in its ledger beside the spool (``path``), so ``cirron export`` sends exactly the rest."""
    workers = []
    for name, exporter in sinks.items():
        ledger, replay_hint = None, ""
        if name == "otlp" and "spool" in sinks:
            endpoint = traces_endpoint()
            ledger = Ledger(path, endpoint).record
            import shlex  # for this hint only

            replay_hint = f"cirron export {shlex.quote(path)} --endpoint {shlex.quote(endpoint)}"
            if protocol() == "grpc":
                replay_hint += " --protocol grpc"
        workers.append(
            SinkWorker(
                name,
                exporter,
                health,
                max_queued,
                wait_for_room=OUTPUTS[name].wait_for_room if name in OUTPUTS else 1.0,
                ledger=ledger,
                replay_hint=replay_hint,
            )
        )
    return workers
