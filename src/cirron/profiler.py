"""``ci.profile()`` and the :class:`Profiler` it returns."""

from __future__ import annotations

import inspect
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Status, StatusCode, get_current_span

from . import config as config_module
from . import exporters, lifecycle, registry, training
from .config import Settings
from .exporters import deflate
from .exporters.sinks import SinkWorker
from .metrics import Recorded
from .metrics import render as render_metrics
from .otel import other_providers, provider, semconv, spans
from .otel.health import Health
from .otel.processor import RingBufferSpanProcessor
from .otel.spans import ScopeSpan
from .otel.store import TraceStore
from .recording import hook_spans, hot, recorder
from .recording.guard import call_guarded
from .recording.recorder import Recorder
from .recording.scopes import close_with_error
from .snapshots import capture as snapshots
from .snapshots import jobs as snapshot_jobs

if TYPE_CHECKING:
    from .metrics import session as metrics_session

_log = logging.getLogger("cirron")
_lock = threading.RLock()
_profiler: Profiler | None = None
_last: Recorder | None = None  # the recorder of the last profiler, for ci.trace() after shutdown
# The metrics of the last profiler, for ci.metrics() after shutdown (while _last is its recorder).
_last_metrics: tuple[Recorder, Recorded] | None = None


class Profiler:
    """Handle on the running profiler: ``health()``, ``flush()``, ``trace()``, ``metrics()``,
    ``shutdown()``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.instrumentors: dict[str, Any] = {}
        self.recorder = Recorder(enabled=False, health=Health(), settings=settings)
        self.workers: list[SinkWorker] = []  # the span sinks, and the metrics sink first
        self.metrics_session: metrics_session.MetricsSession | None = None
        self.transport = "otlp" if exporters.endpoint_configured() else "file"
        self._provider: Any = None
        self._closed = False
        self.zero_code = False  # started by opentelemetry-instrument, not by ci.profile()
        self.started_ns = time.time_ns()

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    @property
    def config(self) -> Mapping[str, Any]:
        """The ``config=`` dict, read-only, for your own feature flags."""
        return MappingProxyType(dict(self.settings.config))

    # -- start ----------------------------------------------------------------
    def _start(self) -> None:
        settings = self.settings
        health = Health()
        store = TraceStore(settings.trace_buffer)
        span_provider, made_by_us = provider.obtain(recorder.span_limits(settings.max_events))
        otlp = self.transport == "otlp" and (
            made_by_us or not provider.exports_otlp_already(span_provider)
        )
        output = settings.output
        if not made_by_us:  # the OTel configurator's own exporters (cirron_spool, ...) suffice
            configured = exporters.sinks_of(spans.exporters_of(span_provider))
            output = tuple(name for name in output if name not in configured)
        sinks = call_guarded(
            "building exporters",
            exporters.build_sinks,
            output,
            settings.path,
            otlp,
            settings.spool_max_bytes,
            settings.spool_compression,
        )
        if sinks is None:  # e.g. the gRPC exporter failed to import: keep the local sinks
            sinks = exporters.build_sinks(
                output, settings.path, False, settings.spool_max_bytes, settings.spool_compression
            )
        self.workers = exporters.sink_workers(
            sinks, settings.path, max(1, settings.buffer_size // 2), health
        )
        index = getattr(sinks.get("spool"), "index_writer", None)
        if index is not None:  # the run's plan, epoch and frameworks in each flush's line
            index.open_spans = store.open_spans
        if settings.metrics:  # first among the sinks: it stops first, and closes beside them
            from .exporters.otlp_metrics import metrics_endpoint_configured
            from .metrics import session as metrics_session  # OpenTelemetry's metrics SDK

            self.metrics_session = call_guarded(
                "starting metrics",
                metrics_session.MetricsSession,
                settings,
                health,
                span_provider.resource,
                metrics_endpoint_configured(),
                max(1, settings.buffer_size // 2),
            )
            if self.metrics_session is not None:
                self.workers.insert(0, self.metrics_session.worker)
        processor = RingBufferSpanProcessor(
            store,
            health,
            self.workers,
            settings.buffer_size,
            settings.flush_interval,
            settings.exit_timeout,
            background=True,  # hook spans are built on its thread, also with no sinks
        )
        spans.add_span_processor_first(span_provider, processor)
        self._provider = span_provider
        self.recorder = recorder.start_session(
            span_provider,
            recorder.session_attributes(),
            health,
            store,
            processor,
            settings,
            parent=provider.parent_from_environment(),
            run=provider.run_root(),
        )
        self.recorder.writes_files = True
        previous = recorder.replace(self.recorder)
        if previous is not None and previous.in_memory:
            self.recorder.watched = previous.watched  # ci.watch() before ci.profile() still counts
        self._install_hooks()
        lifecycle.install(self._at_exit, self._on_signal, self._on_raise, settings.exit_timeout)

    def _install_hooks(self) -> None:
        names = self.settings.frameworks
        if names is None:  # detected, less what OTEL_PYTHON_DISABLED_INSTRUMENTATIONS turns off
            off = registry.disabled_by_environment()
            names = tuple(name for name in registry.detect() if name not in off)
        for name in names:
            registry.when_imported(name, self._attach)

    def _attach(self, name: str) -> None:
        if self._closed or name in self.instrumentors or os.getpid() != self.pid:
            return
        instrumentor = call_guarded(
            f"loading the {name} instrumentor", registry.load_instrumentor, name
        )
        if instrumentor is None:
            return
        # Loaded already by opentelemetry-instrument (its entry point): it records into
        # this profiler's session all the same; nothing to install twice.
        if not getattr(instrumentor, "is_instrumented_by_opentelemetry", False):
            try:
                instrumentor.instrument(tracer_provider=self._provider)
            except Exception as error:  # noqa: BLE001 - a broken hook never stops training
                self.recorder.health.failed(f"instrumenting {name}", error)
                return
        self.instrumentors[name] = instrumentor
        session = self.recorder.session
        if session is not None and session.is_recording():
            session.set_attribute(semconv.FRAMEWORK, list(self.instrumentors))

    # -- handle ---------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Counters and state: spans started/ended/exported/dropped, sinks, buffer use."""
        processor = self.recorder.processor
        if processor is not None and not self._closed:
            processor.ensure_running()  # a dead flush or sink thread is restarted
            processor.build_noted()  # counted as started and ended once built
        report = self.recorder.health.snapshot()
        store = self.recorder.store
        spool = next((w.exporter for w in self.workers if w.name == "spool"), None)
        metrics = self.metrics_session
        report.update(
            enabled=self.enabled and not self._closed,
            hooks=sorted(self.instrumentors),
            transport=self.transport if self.enabled else "none",
            sinks={
                w.name: {"exported": w.exported, "dropped": w.dropped, "errors": w.errors}
                for w in self.workers
                if metrics is None or w is not metrics.worker
            },
            metrics=metrics.health() if metrics is not None else {},
            spool_bytes=getattr(spool, "bytes_written", 0),
            spool_full=getattr(spool, "full", False),
            spool_index_errors=getattr(getattr(spool, "index_writer", None), "errors", 0),
            buffer_capacity=processor.capacity if processor else 0,
            buffer_used=processor.buffer_used if processor else 0,
            trace_evicted=store.evicted if store else 0,
            trace_capacity=store.capacity if store else 0,
            hot_path=hot.hot_path,
            gzip=deflate.compressor_name(),
        )
        return report

    def flush(self, timeout: float | None = None) -> bool:
        """Export everything that has ended, now; returns False if a sink timed out.

        The provider's other processors too (the spool of ``opentelemetry-instrument``
        is one), within the same ``timeout``.
        """
        seconds = self.settings.exit_timeout if timeout is None else _timeout(timeout)
        processor = self.recorder.processor
        if processor is None or self._closed:
            return True
        deadline = time.monotonic() + seconds
        snapshots.drain(seconds)  # snapshot spans still being finished end first
        others = self._flush_others(processor, deadline)
        flushed = processor.force_flush(int(max(0.0, deadline - time.monotonic()) * 1000))
        if self.metrics_session is not None:  # after the spans: the metrics sink has them all now
            flushed = (
                bool(call_guarded("flushing metrics", self.metrics_session.flush, deadline))
                and flushed
            )
        return not (others.wait(deadline) if others is not None else []) and flushed

    def _flush_others(
        self, processor: RingBufferSpanProcessor, deadline: float
    ) -> provider.OthersFlush | None:
        """Begin flushing the provider's other processors, once every span that ended was
        built and handed to them (hook spans are built late, on the flush thread)."""

        def begin() -> provider.OthersFlush:
            processor.build_noted()
            remaining = max(0.0, deadline - time.monotonic())
            return provider.OthersFlush(self._provider, processor, remaining)

        return call_guarded("flushing the provider's other processors", begin)

    def trace(self, format: str = "text", name: str | None = None, last: int | None = None) -> Any:
        """This profiler's spans; see :func:`cirron.trace`."""
        from .offline import readback  # read-back loads when asked, not at ci.profile()

        return readback.render(self.recorder if self.enabled else None, format, name, last)

    def metrics(self, format: str = "df") -> Any:
        """This profiler's metrics; see :func:`cirron.metrics`."""
        return render_metrics(
            self.metrics_session.recorded if self.metrics_session is not None else None, format
        )

    def shutdown(self, interrupted: bool = False, exiting: bool = False) -> None:
        """Close the session, flush, stop the threads and clear the singleton.

        The flush includes the provider's other processors (under
        ``opentelemetry-instrument``, the configurator's), all within
        ``exit_timeout``. ``exiting``: the process ends now, so exporters still
        retrying after that are cut short rather than holding up the exit.
        """
        global _profiler, _last, _last_metrics
        with _lock:
            if self._closed:
                return
            self._closed = True
            if _profiler is self:
                _profiler = None
        lifecycle.uninstall()
        if not self.enabled or os.getpid() != self.pid:
            if recorder.current is self.recorder:
                recorder.replace(None)
            return
        if not interrupted:  # (a signal's path has ended every span already)
            # The snapshots being finished end; then every open span, innermost first,
            # the last epoch through its owner's rules (its snapshot); that snapshot
            # ends, and the session last.
            snapshot_jobs.drain(self.settings.exit_timeout)
            self._end_open_spans(error=None, session=False)
            snapshot_jobs.stop(self.settings.exit_timeout)
        for name, instrumentor in self.instrumentors.items():
            call_guarded(f"uninstrumenting {name}", lambda i=instrumentor: i.uninstrument())
        self._end_open_spans(error=None, interrupted=interrupted)
        processor = self.recorder.processor
        if processor is not None:
            self._stop_exporting(processor, interrupted, exiting)
        if self.metrics_session is not None:  # every span reached the metrics: their summary
            call_guarded("the run's summary", self._print_summary)
        _last = self.recorder
        if self.metrics_session is not None:
            _last_metrics = (self.recorder, self.metrics_session.recorded)
        if recorder.current is self.recorder:
            recorder.replace(None)

    def _print_summary(self) -> None:
        # Imported at exit, so nothing new it imports may exec() or eval() a string (as a
        # dataclass or a named tuple does): after an uncaught Ctrl-C that makes CPython
        # forget the KeyboardInterrupt, and the process ends with 1, not as SIGINT ends it.
        from .metrics import run_summary

        settings = self.settings
        if self.metrics_session is None or not run_summary.wanted(
            settings.run_summary, settings.output, sys.stderr
        ):
            return
        elapsed = time.time_ns() - self.started_ns
        path = settings.path if "spool" in settings.output else None
        run_summary.print_summary(self.metrics_session.instruments, elapsed, path)

    def _stop_exporting(
        self, processor: RingBufferSpanProcessor, interrupted: bool, exiting: bool
    ) -> None:
        """Flush cirron's sinks and the provider's other processors side by side, in one
        ``exit_timeout``; stop cirron's."""
        timeout = self.settings.exit_timeout
        deadline = time.monotonic() + timeout
        others = self._flush_others(processor, deadline)
        processor.shutdown(timeout, interrupted=interrupted)
        provider.remove_processor(self._provider, processor)
        if self.metrics_session is not None:  # its closing began when its sink stopped, first
            call_guarded("closing metrics", self.metrics_session.close, deadline)
        # At exit, the program's metrics and logs providers end by the same deadline (with
        # cirron's last metrics in): the SDK's own exit hooks would wait for their retries.
        signals = (
            call_guarded("ending metrics and logs", other_providers.ProvidersShutdown, deadline)
            if exiting
            else None
        )
        late = others.wait(deadline) if others is not None else []
        if late and exiting:
            provider.cut_short(self._provider, late, timeout)
        if signals is not None:
            call_guarded("ending metrics and logs", signals.cut_short_late, deadline, timeout)

    # -- exit paths -------------------------------------------------------------
    def _end_open_spans(
        self, error: BaseException | str | None, interrupted: bool = False, session: bool = True
    ) -> None:
        """End every open span, innermost first, the session last (``session``: it too).

        An open epoch or step ends as its owner would end it (its snapshot is
        taken), unless ``interrupted``: a signal froze the main thread somewhere
        in our code, so never wait on a lock it may hold, and finish the
        ``on_end`` of a span whose ``end()`` it cut short.
        """
        store = self.recorder.store
        processor = self.recorder.processor
        if store is None:
            return
        hook_spans.build_open()  # a forward still running gets its span, ended below
        session_span = self.recorder.session
        open_spans = [span for span in reversed(store.open_spans()) if span is not session_span]
        if session and session_span is not None and session_span.is_recording():
            open_spans.append(session_span)  # (not one a sampler dropped: nothing to end)
        for span in open_spans:
            if span.end_time is not None:
                if interrupted and processor is not None:
                    processor.on_end_interrupted(spans.ended_copy(span))
                continue
            lock = spans.span_lock(span)  # SDK spans; ours have none
            if interrupted and lock is not None:
                if not lock.acquire(timeout=0.1):
                    continue  # held by the frozen thread: this one span is lost
                lock.release()
            if error is not None:
                close_with_error(span, error)
            if interrupted or not call_guarded("ending an epoch", training.end_moment, span):
                span.end()

    def _at_exit(self) -> None:
        if os.getpid() != self.pid:
            return
        # A script that died of an uncaught exception: its run failed, and the
        # spans still open say so (the interpreter keeps the error in sys.last_value).
        error = getattr(sys, "last_value", None)
        if isinstance(error, BaseException) and not hasattr(sys, "ps1"):
            self._mark_failed(error)
        self.shutdown(exiting=True)

    def _mark_failed(self, error: BaseException) -> None:
        """Record ``error`` on every span still open (shutdown then ends them)."""
        store = self.recorder.store
        hook_spans.build_open()
        for span in store.open_spans() if store is not None else ():
            if span.is_recording():
                close_with_error(span, error)

    def _on_signal(self, name: str, dying: bool) -> None:
        self.recorder.signal = name
        if dying:
            self._end_open_spans(error=f"terminated by {name}", interrupted=True)
            self.shutdown(interrupted=True)
        else:
            self.flush()

    def _on_raise(self, name: str, error: BaseException) -> None:
        """The previous handler raised (Ctrl-C): the interrupted scopes failed.

        Runs in the interrupted thread, so the current OTel context is the stack
        of scopes the exception is about to unwind. Loop wrappers close their
        scopes from a finalizer that can't see the exception: mark them here.
        """
        status = Status(StatusCode.ERROR, f"{name}: {type(error).__name__}")
        span = get_current_span()
        session = self.recorder.session
        while isinstance(span, ScopeSpan) and span is not session:
            if span.is_recording():
                span.set_status(status)
            span = span._parent_span


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _disabled(settings: Settings) -> Profiler:
    profiler = Profiler(settings)
    recorder.replace(profiler.recorder)  # enabled=False: every scope is a no-op
    return profiler


def profile(
    config: dict[str, Any] | None = None,
    frameworks: list[str] | None = None,
    snapshots: str | None = None,
    sample_rate: float | None = None,
    flush_interval: float | None = None,
    enabled: bool = True,
    path: str | None = None,
    output: str | list[str] | None = None,
    metrics: bool | None = None,
    capture: bool | dict[str, Any] | None = None,
    **unknown: Any,
) -> Profiler:
    """Attach the profiler to this process; call once.

    Detects torch, TensorFlow/Keras, transformers, Lightning and trainloop (or uses
    ``frameworks=``) and installs their hooks, opens the ``cirron.session`` root span,
    starts the background flush thread and registers clean-shutdown handlers. A
    second call returns the same handle and logs a warning.

    Each setting resolves as: explicit argument, then ``config=`` key, then
    environment variable (``CIRRON_FRAMEWORKS``, ``CIRRON_SNAPSHOTS``,
    ``CIRRON_SAMPLE_RATE``, ``CIRRON_FLUSH_INTERVAL``, ``CIRRON_PATH``,
    ``CIRRON_OUTPUT``, ``CIRRON_METRICS``), then the default. ``enabled=False`` or
    ``OTEL_SDK_DISABLED=true`` gives a no-op profiler. OTLP export is on when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set; OTLP
    metrics when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._METRICS_ENDPOINT``) is.

    Args:
        config: your runtime feature flags (``Profiler.config``), and any setting by name.
        frameworks: install hooks for exactly these (``torch``, ``tensorflow``, ``transformers``,
            ``lightning``, ``trainloop``).
        snapshots: ``"stats"`` (default), ``"sampled"`` or ``"full"``.
        sample_rate: fraction of epoch boundaries that write raw tensors (default 0.01).
        flush_interval: seconds between background flushes (default 1.0).
        enabled: False builds a no-op profiler: no hooks, no threads, no files.
        path: local directory for the spool and snapshots (default ``./.cirron``).
        output: local sinks, ``"spool"`` (default), ``"log"``, ``"stdout"``, ``"none"`` or a list.
        metrics: OpenTelemetry metrics (default True): marks, step time by part, step and
            epoch counters, per-step CPU and memory, and system CPU, memory and GPU sampled
            every ``metrics_interval`` seconds (a ``config=`` setting, default 1.0,
            ``CIRRON_METRICS_INTERVAL``) by one background thread. They go where the traces
            go: the program's ``MeterProvider`` when it set one, OTLP, the spool's
            ``metrics/`` files, a line per epoch on ``stdout``/``log``; always to
            ``ci.metrics()``. False: none of it, and no thread.
        capture: what inference spans (``ci.inference``, ``generate``) record of a model's
            inputs and outputs; nothing by default. ``{"text": True}``: prompts and completions
            as OpenTelemetry GenAI messages, secrets redacted; ``"tensors": "shapes"``: input
            and output shapes; ``"max_chars"``: characters kept of each text (default 2048);
            ``"where"``: ``"span"`` attributes (default), an ``"event"``, or ``"both"``.
            ``CIRRON_CAPTURE`` (``text,tensors,max_chars=500``), else
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true``, ``SPAN_ONLY``, ...).
    """
    global _profiler
    if unknown:
        raise _unknown_argument(sorted(unknown)[0])
    # Validated first, even when a profiler runs: a wrong argument is an error in every call.
    settings = config_module.resolve(
        config,
        enabled,
        frameworks=frameworks,
        snapshots=snapshots,
        sample_rate=sample_rate,
        flush_interval=flush_interval,
        path=path,
        output=output,
        metrics=metrics,
        capture=capture,
    )
    with _lock:
        existing = _profiler
        if existing is not None and existing.pid == os.getpid():
            if existing.zero_code:
                _log.info(
                    "cirron: profiling since start-up (opentelemetry-instrument); ci.profile() "
                    "returns that profiler, configured by the CIRRON_* variables"
                )
            else:
                _log.warning(
                    "cirron: ci.profile() was already called; returning the running "
                    "profiler (arguments of this call are ignored)"
                )
            return existing
        if not settings.enabled:
            _profiler = _disabled(settings)
            return _profiler
        profiler = Profiler(settings)
        profiler._start()
        _profiler = profiler
        return profiler


def _unknown_argument(name: str) -> TypeError:
    """The error for ``ci.profile(name=...)``: the closest argument, or where a setting goes."""
    arguments = [p for p in inspect.signature(profile).parameters if p != "unknown"]
    if name in config_module.SETTINGS:
        return TypeError(
            f"ci.profile() has no argument {name!r}: it is a setting, pass it as "
            f"config={{{name!r}: ...}} (or its CIRRON_* variable)"
        )
    return TypeError(
        f"ci.profile() got an unexpected keyword argument {name!r}"
        + config_module.closest(name, [*arguments, *config_module.SETTINGS])
    )


def current() -> Profiler | None:
    return _profiler


def shutdown() -> None:
    """Close the session, flush, stop the flush thread and clear the profiler.

    The next ``ci.profile()`` starts fresh. Safe to call twice, or without a profiler.
    """
    profiler = _profiler
    if profiler is not None:
        profiler.shutdown()
    elif recorder.current is not None and recorder.current.in_memory:
        recorder.replace(None)


def flush(timeout: float | None = None) -> bool:
    """Synchronously export every ended span to every sink (bounded by ``timeout``).

    ``timeout``: seconds, default ``exit_timeout``; returns False if a sink
    did not finish in time (what it has not written yet stays queued).
    """
    if timeout is not None:
        _timeout(timeout)
    profiler = _profiler
    return profiler.flush(timeout) if profiler is not None else True


def health() -> dict[str, Any]:
    """A dict of counters and state; the docs' Health page says what each key means."""
    profiler = _profiler
    if profiler is not None:
        return profiler.health()
    rec = recorder.current
    report = rec.health.snapshot() if rec is not None else Health().snapshot()
    store = rec.store if rec is not None else None
    report.update(
        enabled=False,
        hooks=[],
        transport="none",
        sinks={},
        metrics={},
        spool_bytes=0,
        spool_full=False,
        spool_index_errors=0,
        buffer_capacity=0,
        buffer_used=0,
        trace_evicted=store.evicted if store else 0,
        trace_capacity=store.capacity if store else 0,
        hot_path=hot.hot_path,
        gzip=deflate.compressor_name(),
    )
    return report


def trace(format: str = "text", name: str | None = None, last: int | None = None) -> Any:
    """The session's spans from memory, as ``text`` (default), ``dict``, ``json`` or ``df``.

    ``name=`` keeps spans of that name (with their subtrees); ``last=N`` the N
    most recently closed spans; with either, ``dict`` returns a list of nodes.
    Works without ``ci.profile()`` and never writes a file.
    """
    rec = recorder.current
    if rec is None:
        rec = _last
    if rec is not None and not rec.enabled:
        rec = None
    from .offline import readback  # read-back loads when asked, not at ci.profile()

    return readback.render(rec, format, name, last)


def metrics(format: str = "df") -> Any:
    """The metrics recorded by the profiler (or the last one, after ``ci.shutdown()``).

    One row per measurement, what was handed to each OpenTelemetry instrument: a mark's
    every value, each step's time per part, each system sample. ``format="df"`` (default):
    a pandas DataFrame with columns ``name``, ``kind``, ``unit``, ``time_ns``, ``value``,
    ``attributes``, ``trace_id`` and ``span_id`` (hex, the span the value came from, as its
    exemplar carries it; None for a system sample). ``format="dict"``: per instrument name,
    ``{"kind", "unit", "description", "points": [...]}``. Empty when metrics are off.
    The newest 25,000 measurements are kept.
    """
    profiler = _profiler
    if profiler is not None:
        return profiler.metrics(format)
    last = _last_metrics
    recorded = last[1] if last is not None and last[0] is _last else None
    return render_metrics(recorded, format)


def _after_fork_in_child() -> None:
    # A forked child (DataLoader worker, multiprocessing) must not flush or
    # shut down the parent's session; ci.profile() in the child starts fresh.
    global _profiler, _lock
    _lock = threading.RLock()
    if _profiler is not None and _profiler.enabled:
        _profiler._closed = True
        _profiler = None
        recorder._lock = threading.Lock()  # may have been held by a parent thread
        recorder.current = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
