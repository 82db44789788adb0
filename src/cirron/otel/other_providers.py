"""The program's metrics and logs providers at exit: ended within the traces' ``exit_timeout``.

``opentelemetry-instrument``'s configurator (or the program) sets a global SDK
``MeterProvider`` and ``LoggerProvider``, with OTLP exporters by default, and the SDK ends
them in exit hooks of their own, registered before cirron's (so run after it) and bounded by
30 s: against an unreachable endpoint the last export retries until the exporter's timeout,
and the process ends ~15 s after the program. So at exit cirron takes those hooks over: it
shuts each provider down itself (its last collection and export) by the deadline of the
spans' flush, and a provider still exporting then has its exporters shut down, which ends
their retries (as :func:`cirron.otel.provider.cut_short` does for span processors): what it
had not delivered is lost, said in one warning. A provider whose hook is not registered (made
with ``shutdown_on_exit=False``, or ended already) is the program's to end, and left alone.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from typing import Any

from .spans import exporters_of_processor
from .threads import daemon_thread

_log = logging.getLogger("cirron")


def _sdk_providers() -> list[tuple[str, Any]]:
    """The global SDK meter and logger providers, with the signal each carries.

    Only from SDK modules already imported (none imported: no such provider exists). At exit
    an import is no option: the logs SDK builds a default resource when imported, on a thread
    pool the interpreter no longer lets start."""
    found: list[tuple[str, Any]] = []
    metrics_sdk = sys.modules.get("opentelemetry.sdk.metrics")
    if metrics_sdk is not None:
        from opentelemetry import metrics

        meter_provider = metrics.get_meter_provider()
        if isinstance(meter_provider, metrics_sdk.MeterProvider):
            found.append(("metrics", meter_provider))
    logs_sdk = sys.modules.get("opentelemetry.sdk._logs")
    if logs_sdk is not None:
        from opentelemetry._logs import get_logger_provider

        logger_provider = get_logger_provider()
        if isinstance(logger_provider, logs_sdk.LoggerProvider):
            found.append(("logs", logger_provider))
    return found


def _shut_down(provider: Any, timeout: float) -> None:
    try:
        if hasattr(provider, "_metric_readers"):
            provider.shutdown(timeout_millis=timeout * 1000)
        else:
            provider.shutdown()  # (a logger provider's processors bound it themselves)
    except Exception as error:  # noqa: BLE001 - someone else's provider never breaks exit
        _log.debug("cirron: shutting %s down failed: %s", type(provider).__name__, error)


def _exit_hook(provider: Any) -> Any:
    """The SDK's exit hook of ``provider``, when still registered."""
    return getattr(provider, "_atexit_handler", None) or getattr(provider, "_at_exit_handler", None)


class ProvidersShutdown:
    """The global SDK meter and logger providers, shut down on threads of their own, now,
    instead of by their exit hooks."""

    def __init__(self, deadline: float) -> None:
        self._closing: list[tuple[str, Any, threading.Thread]] = []
        for signal, provider in _sdk_providers():
            hook = _exit_hook(provider)
            if hook is None:
                continue
            atexit.unregister(hook)
            thread = daemon_thread(
                _shut_down,
                f"cirron-end-{signal}",
                (provider, max(0.0, deadline - time.monotonic())),
            )
            thread.start()
            self._closing.append((signal, provider, thread))

    def cut_short_late(self, deadline: float, waited: float) -> list[str]:
        """Wait for the shutdowns until ``deadline`` (``time.monotonic()``); end the exports
        of the providers still exporting then. Returns the signals given up on."""
        for _, _, thread in self._closing:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [(signal, p) for signal, p, thread in self._closing if thread.is_alive()]
        for signal, provider in late:
            _cut_short(signal, provider, waited)
        return [signal for signal, _ in late]


def _exporters(provider: Any) -> list[Any]:
    """The exporters behind a meter provider's readers or a logger provider's processors."""
    holders: list[Any] = list(getattr(provider, "_metric_readers", ()) or ())
    multi = getattr(provider, "_multi_log_record_processor", None)
    holders += list(getattr(multi, "_log_record_processors", ()) or ())
    found: list[Any] = []
    for holder in holders:  # (a reader or a processor holds its exporter as a span processor)
        for exporter in exporters_of_processor(holder):
            if not any(exporter is seen for seen in found):
                found.append(exporter)
    return found


def _cut_short(signal: str, provider: Any, waited: float) -> None:
    names = []
    for exporter in _exporters(provider):
        names.append(type(exporter).__name__)
        try:
            exporter.shutdown()
        except Exception as error:  # noqa: BLE001 - someone else's exporter never breaks exit
            _log.debug("cirron: shutting %s down failed: %s", type(exporter).__name__, error)
    _log.warning(
        "cirron: the %s exporter (%s) was still exporting %.3g s after the end of the program "
        "(CIRRON_EXIT_TIMEOUT); what it had not delivered is dropped",
        signal,
        ", ".join(names) or type(provider).__name__,
        waited,
    )
