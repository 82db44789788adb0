"""One profiler's metrics: the instruments, the sink that derives them, the sampler, the providers.

:class:`MetricsSession` is made by the profiler when ``metrics`` is on. Its
:attr:`~MetricsSession.worker` is a sink worker the profiler puts among the span sinks;
its :meth:`~MetricsSession.flush` runs with ``ci.flush()`` and :meth:`~MetricsSession.close`
with ``ci.shutdown()``, both within the traces' ``exit_timeout``. Closing begins as soon as
the last spans reached the metrics sink, beside the other sinks' own closing.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource

from ..config import Settings
from ..exporters.metrics_files import MetricsFileExporter
from ..exporters.sinks import SinkWorker
from ..otel import semconv
from ..otel.health import Health
from ..otel.version import __version__
from . import providers, summary
from .from_spans import SpanMetrics
from .instruments import (
    BYTES_BOUNDARIES,
    DURATION_BOUNDARIES,
    METER_NAME,
    Instruments,
)
from .recorded import Recorded
from .sampler import Sample, SystemSampler

Observations = Iterable[tuple[float | int, Mapping[str, Any]]]


class MetricsSession:
    """Everything metrics of one profiler; see the module docstring."""

    def __init__(
        self, settings: Settings, health: Health, resource: Resource, otlp: bool, max_queued: int
    ) -> None:
        self.recorded = Recorded()
        self.program_provider = providers.program_provider()
        self.files = MetricsFileExporter(settings.path) if "spool" in settings.output else None
        readers = providers.readers(
            self.files,
            otlp=otlp and self.program_provider is None,
            interval=settings.metrics_interval,
        )
        self.own_provider = providers.own_provider(readers, resource) if readers else None
        meters = [
            provider.get_meter(METER_NAME, __version__)
            for provider in (self.program_provider, self.own_provider)
            if provider is not None
        ]
        self.instruments = Instruments(meters, self.recorded, health)
        writers = [summary.write_stdout] if "stdout" in settings.output else []
        writers += [summary.write_log] if "log" in settings.output else []
        self.span_metrics = SpanMetrics(
            self.instruments, summary.EpochSummary(writers), health, on_shutdown=self._begin_close
        )
        self.sampler = SystemSampler(settings.metrics_interval, self._sampled, health)
        self._define_instruments()
        # Never waited for: a burst the metrics sink can't keep up with costs some figures
        # (counted), never the training thread's time.
        self.worker = SinkWorker(
            "metrics", self.span_metrics, health, max_queued, wait_for_room=0.0, loses_spans=False
        )
        self._closing: list[threading.Thread] = []
        self._close_lock = threading.Lock()
        self.sampler.start()

    # -- the instruments ------------------------------------------------------------------
    def _define_instruments(self) -> None:
        add = self.instruments
        add.histogram(semconv.STEP_DURATION, "s", "a step's wall time", DURATION_BOUNDARIES)
        add.summed_counter(
            semconv.STEP_TIME, "s",
            "the steps' time in each part, by cirron.step.part (the parts add up to the steps)",
        )  # fmt: skip
        add.summed_counter(semconv.STEP_COUNT, "{step}", "steps that ended")
        add.counter(semconv.EPOCH_COUNT, "{epoch}", "epochs that ended")
        add.histogram(
            semconv.STEP_CPU_TIME, "s", "the training thread's CPU time in a step",
            DURATION_BOUNDARIES,
        )  # fmt: skip
        add.histogram(
            semconv.STEP_MEMORY_USAGE, "By", "the process's RSS at a step's end", BYTES_BOUNDARIES
        )
        add.histogram(
            semconv.STEP_CUDA_MEMORY_PEAK_ALLOCATED, "By",
            "CUDA memory allocated at its peak in a step", BYTES_BOUNDARIES,
        )  # fmt: skip
        add.histogram(
            semconv.STEP_CUDA_MEMORY_PEAK_RESERVED, "By",
            "CUDA memory the caching allocator reserved at its peak in a step", BYTES_BOUNDARIES,
        )  # fmt: skip
        add.observable(
            semconv.PROCESS_CPU_TIME, "counter", "s", "the process's CPU time, by mode",
            self._cpu_time,
        )  # fmt: skip
        add.observable(
            semconv.PROCESS_CPU_UTILIZATION, "gauge", "1",
            "the process's CPU time over wall time and the CPUs it may use", self._utilization,
        )  # fmt: skip
        add.observable(
            semconv.PROCESS_MEMORY_USAGE, "up_down_counter", "By", "the process's RSS", self._rss
        )
        add.observable(
            semconv.HW_GPU_UTILIZATION, "gauge", "1", "the share of time a kernel ran on the GPU",
            lambda: self._gpus("utilization"),
        )  # fmt: skip
        add.observable(
            semconv.HW_GPU_MEMORY_USAGE, "up_down_counter", "By", "the GPU's memory in use",
            lambda: self._gpus("memory_used"),
        )  # fmt: skip
        add.observable(
            semconv.HW_GPU_MEMORY_LIMIT, "up_down_counter", "By", "the GPU's memory",
            lambda: self._gpus("memory_total"),
        )  # fmt: skip

    # -- the sampler's latest sample, as observations --------------------------------------
    def _cpu_time(self, sample: Sample | None = None) -> Observations:
        sample = sample or self.sampler.latest
        if sample is None:
            return []
        user, system = semconv.CPU_MODES
        return [(sample.cpu_user, {semconv.CPU_MODE: user}),
                (sample.cpu_system, {semconv.CPU_MODE: system})]  # fmt: skip

    def _utilization(self, sample: Sample | None = None) -> Observations:
        sample = sample or self.sampler.latest
        if sample is None or sample.cpu_utilization is None:
            return []
        return [(sample.cpu_utilization, {})]

    def _rss(self, sample: Sample | None = None) -> Observations:
        sample = sample or self.sampler.latest
        return [] if sample is None or sample.rss is None else [(sample.rss, {})]

    def _gpus(self, field: str, sample: Sample | None = None) -> Observations:
        sample = sample or self.sampler.latest
        if sample is None:
            return []
        return [
            (
                getattr(gpu, field),
                {semconv.HW_ID: gpu.id, semconv.HW_NAME: gpu.name, semconv.HW_VENDOR: "NVIDIA"},
            )
            for gpu in sample.gpus
        ]

    def _sampled(self, sample: Sample) -> None:
        """Keep each figure of ``sample`` for ``ci.metrics()`` (the sampler's thread)."""
        keep = self.instruments.keep
        for name, observations in (
            (semconv.PROCESS_CPU_TIME, self._cpu_time(sample)),
            (semconv.PROCESS_CPU_UTILIZATION, self._utilization(sample)),
            (semconv.PROCESS_MEMORY_USAGE, self._rss(sample)),
            (semconv.HW_GPU_UTILIZATION, self._gpus("utilization", sample)),
            (semconv.HW_GPU_MEMORY_USAGE, self._gpus("memory_used", sample)),
            (semconv.HW_GPU_MEMORY_LIMIT, self._gpus("memory_total", sample)),
        ):
            for value, attributes in observations:
                keep(name, sample.time_ns, value, attributes)

    # -- flush and close ------------------------------------------------------------------
    def _providers(self) -> list[MeterProvider]:
        return [p for p in (self.program_provider, self.own_provider) if p is not None]

    def flush(self, deadline: float) -> bool:
        """Derive what the sink holds, then flush every provider, by ``deadline``
        (``time.monotonic()``); False when one did not finish in time."""
        self.span_metrics.flush()
        millis = max(0.0, deadline - time.monotonic()) * 1000
        threads = [
            providers.bounded("flush", functools.partial(provider.force_flush, millis))
            for provider in self._providers()
        ]
        return providers.wait(threads, deadline)

    def _begin_close(self) -> None:
        """Begin closing, on a thread: when the metrics sink handled its last spans (its
        worker stops, first of the sinks), beside the other sinks' closing."""
        with self._close_lock:
            if self._closing:
                return
            self._closing = [providers.bounded("close", self._close_providers)]

    def _close_providers(self) -> None:
        self.sampler.stop(1.0)
        if not self.sampler.running:  # one last sample: a short run has one too, and the end
            try:
                self.sampler.sample()
            finally:
                self.sampler.close()
        if self.own_provider is not None:
            self.own_provider.shutdown()
        if self.program_provider is not None:  # the program's: flushed, never shut down
            self.program_provider.force_flush()

    def close(self, deadline: float) -> bool:
        """Stop the sampler, take a last sample, end cirron's provider (flush the program's),
        by ``deadline``."""
        self._begin_close()
        return providers.wait(self._closing, deadline)

    def health(self) -> dict[str, Any]:
        worker = self.worker
        return {
            "spans_read": worker.exported,
            "spans_missed": worker.dropped,
            "recorded": len(self.recorded),
            "evicted": self.recorded.evicted,
            "samples": self.sampler.samples,
            "files_written": self.files.files_written if self.files is not None else 0,
            "file_errors": self.files.errors if self.files is not None else 0,
            "sampler_cpu_ns": self.sampler.cpu_ns,
            "providers": ["program"] * (self.program_provider is not None)
            + ["cirron"] * (self.own_provider is not None),
        }
