"""Zero-code: ``opentelemetry-instrument python train.py``, with no ``import cirron`` in the script.

``opentelemetry-instrument`` runs its ``sitecustomize`` before the script:

1. the distro and the configurator (``opentelemetry-distro``, a dependency of
   this package) build the SDK ``TracerProvider`` and the exporters
   ``OTEL_TRACES_EXPORTER`` names: ``otlp``, and cirron's local sinks
   ``cirron_spool``, ``cirron_stdout``, ``cirron_log``;
2. every ``opentelemetry_instrumentor`` entry point not named in
   ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` is instrumented: ``cirron_torch``,
   ``cirron_keras``, ``cirron_transformers``, ``cirron_lightning``,
   ``cirron_trainloop`` (each attaches when the script imports its framework,
   and imports none itself);
3. the ``opentelemetry_post_instrument`` entry points run: :func:`start`.

:func:`start` starts the profiler as ``ci.profile()`` would, configured by the
``CIRRON_*`` variables, on the configurator's provider: the
``cirron.session`` span, the training moments, snapshots, ``ci.trace()``, and
the local sinks ``CIRRON_OUTPUT`` names (the spool by default) less those the
configurator exports to already. The instrumentors it finds loaded are
adopted, not loaded twice. A ``ci.profile()`` in the script returns this
profiler.

The OTLP protocol is the one thing cirron cannot choose here: ``opentelemetry-distro``
sets ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` when it is unset, before any code of
cirron runs (a distro or configurator of cirron's own would be one of two, and
which one loads is up to the order of installed packages). When the endpoint's
port says otherwise (4318 is OTLP/HTTP), :func:`start` says so, naming the
variable that fixes it.
"""

from __future__ import annotations

import logging

from .exporters import export_errors

_log = logging.getLogger("cirron")


def start() -> None:
    """Start profiling at interpreter start-up (the ``cirron`` post-instrument entry point)."""
    try:
        from . import profiler

        _describe_the_process()
        handle = profiler.profile()
        handle.zero_code = True
    except Exception as error:  # noqa: BLE001 - the program runs, traced or not
        _log.warning(
            "cirron: could not start profiling under opentelemetry-instrument (%s: %s); "
            "the program runs untraced",
            type(error).__name__,
            error,
        )
    try:
        _warn_if_the_protocol_misses_the_port()
        export_errors.install()  # one line, not a retry log, when nothing listens
    except Exception:  # noqa: BLE001, S110 - only advice: the program runs as it would
        pass


def _describe_the_process() -> None:
    """The configurator's provider gets the resource ``ci.profile()`` gives its own (the
    script's name, the rank, the run, the host and pid, an instance id stable per run and
    rank), ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` still on top: without it the
    spool cannot tell runs and ranks apart."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from .otel import resource, spans

    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        spans.extend_resource(provider, resource.build_resource())


def _warn_if_the_protocol_misses_the_port() -> None:
    """An endpoint on 4318 spoken to in gRPC (the distro's default) receives nothing: say so."""
    from .exporters import otlp

    implied, chosen = otlp.endpoint_protocol(), otlp.chosen_protocol()
    configured = otlp.configured_endpoint()
    if configured is None or implied is None or chosen in ("", implied):
        return
    variable, endpoint = configured
    _log.warning(
        "cirron: %s=%s is an OTLP %s endpoint, but the OTLP protocol is %s "
        "(opentelemetry-instrument's default when none is set): nothing will arrive there; "
        "set OTEL_EXPORTER_OTLP_PROTOCOL=%s",
        variable,
        endpoint,
        "gRPC" if implied == "grpc" else "HTTP",
        chosen,
        implied,
    )
