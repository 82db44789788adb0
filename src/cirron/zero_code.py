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
"""

from __future__ import annotations

import logging

_log = logging.getLogger("cirron")


def start() -> None:
    """Start profiling at interpreter start-up (the ``cirron`` post-instrument entry point)."""
    try:
        from . import profiler

        handle = profiler.profile()
        handle.zero_code = True
    except Exception as error:  # noqa: BLE001 - the program runs, traced or not
        _log.warning(
            "cirron: could not start profiling under opentelemetry-instrument (%s: %s); "
            "the program runs untraced",
            type(error).__name__,
            error,
        )
