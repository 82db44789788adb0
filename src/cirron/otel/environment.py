"""Every environment variable cirron reads, in one place.

The standard OpenTelemetry variables keep their meaning; the ``CIRRON_*`` ones
are defaults for the matching :func:`cirron.profile` argument (an explicit
argument or a ``config=`` key wins over them), and the whole configuration of
a zero-code run (``opentelemetry-instrument``).

This module is registered under ``opentelemetry_environment_variables``.
``opentelemetry-instrument`` turns each ``OTEL_*`` name of such a module into
a command-line option, so the standard names here are kept without that
prefix (the SDK registers them already; twice would be a conflict).
"""

from __future__ import annotations

# Standard OpenTelemetry variables.
SDK_DISABLED = "OTEL_SDK_DISABLED"
SERVICE_NAME = "OTEL_SERVICE_NAME"
RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"  # metrics only (wins)
EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"  # metrics only (wins)
METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"  # ms between OTLP metric exports
TRACEPARENT = "TRACEPARENT"
TRACESTATE = "TRACESTATE"

PYTHON_DISABLED_INSTRUMENTATIONS = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
# OpenTelemetry GenAI instrumentations' switch for prompt and completion text: true / false, or
# NO_CONTENT / SPAN_ONLY / EVENT_ONLY / SPAN_AND_EVENT (below CIRRON_CAPTURE).
INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

# Settings of cirron.profile().
CIRRON_ENABLED = "CIRRON_ENABLED"  # false / 0 / no: a no-op profiler
CIRRON_FRAMEWORKS = "CIRRON_FRAMEWORKS"  # comma-separated, e.g. "torch,transformers"
CIRRON_SNAPSHOTS = "CIRRON_SNAPSHOTS"  # stats | sampled | full
CIRRON_SAMPLE_RATE = "CIRRON_SAMPLE_RATE"  # 0.0 .. 1.0
CIRRON_FLUSH_INTERVAL = "CIRRON_FLUSH_INTERVAL"  # seconds
CIRRON_PATH = "CIRRON_PATH"  # local directory, default ./.cirron
CIRRON_OUTPUT = "CIRRON_OUTPUT"  # comma-separated sinks: spool,log,stdout,none
CIRRON_BUFFER_SIZE = "CIRRON_BUFFER_SIZE"  # ring buffer capacity, in spans
CIRRON_TRACE_BUFFER = "CIRRON_TRACE_BUFFER"  # spans kept in memory for ci.trace()
CIRRON_EXIT_TIMEOUT = "CIRRON_EXIT_TIMEOUT"  # seconds exit may wait for exporters
CIRRON_MAX_EVENTS = "CIRRON_MAX_EVENTS"  # point marks kept per span
CIRRON_EPOCH_STEPS = "CIRRON_EPOCH_STEPS"  # optimizer steps per epoch without a DataLoader
CIRRON_TRACE_SPLIT = "CIRRON_TRACE_SPLIT"  # spans before each later epoch is a trace of its own
CIRRON_STEP_SAMPLING = "CIRRON_STEP_SAMPLING"  # "K,N": hook spans for K steps, then every Nth
CIRRON_SPOOL_MAX_BYTES = "CIRRON_SPOOL_MAX_BYTES"  # bytes of spool files one process may write
CIRRON_SPOOL_COMPRESSION = "CIRRON_SPOOL_COMPRESSION"  # gzip (default) or none
CIRRON_METRICS = "CIRRON_METRICS"  # true / false: OpenTelemetry metrics from the spans
CIRRON_METRICS_INTERVAL = "CIRRON_METRICS_INTERVAL"  # seconds between system samples
# Seconds between steps that carry their CPU time and memory (0: every step).
CIRRON_STEP_RESOURCES_INTERVAL = "CIRRON_STEP_RESOURCES_INTERVAL"
CIRRON_CAPTURE = "CIRRON_CAPTURE"  # what inference spans record: "text,tensors,max_chars=N"
CIRRON_RUN_SUMMARY = "CIRRON_RUN_SUMMARY"  # true / false: the run's summary on stderr at its end
CIRRON_PURE_PYTHON = "CIRRON_PURE_PYTHON"  # true: the pure-Python twin of the compiled hook

# Platform context, recorded as resource attributes.
CIRRON_RUN_ID = "CIRRON_RUN_ID"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
CIRRON_PIPELINE_ID = "CIRRON_PIPELINE_ID"
CIRRON_DEPLOYMENT_ID = "CIRRON_DEPLOYMENT_ID"
CIRRON_WORKSPACE_ID = "CIRRON_WORKSPACE_ID"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # the GPUs the system sampler reads
