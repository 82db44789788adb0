"""cirron: OpenTelemetry-native tracing for ML training.

    import cirron as ci
    ci.profile()        # hooks for torch / tensorflow+keras / transformers
    trainer.train()     # epochs, steps, forward, backward, ... become spans

Regions and values of your own::

    for epoch in ci.epochs(range(3)):
        for batch in ci.batches(loader):
            with ci.scope("augment"):
                ...
            ci.mark("loss", loss.item())

Read back with ``ci.trace()`` (and the metrics with ``ci.metrics()``); spans also go to
``./.cirron/spool/`` as OTLP/JSON (metrics to ``./.cirron/metrics/``) and to any OTLP
endpoint set in ``OTEL_EXPORTER_OTLP_ENDPOINT``.
"""

from __future__ import annotations

from .exporters.spool import iter_spool, iter_spool_spans, read_spool, spool_spans
from .inference import inference
from .otel.version import __version__
from .profiler import Profiler, flush, health, metrics, profile, shutdown, trace
from .recording.marks import mark
from .recording.scopes import Scope, scope
from .snapshots.watch import watch
from .training.loops import batches, epochs
from .wrap import wrap

__all__ = [
    "Profiler",
    "Scope",
    "__version__",
    "batches",
    "epochs",
    "flush",
    "health",
    "inference",
    "iter_spool",
    "iter_spool_spans",
    "mark",
    "metrics",
    "profile",
    "read_spool",
    "scope",
    "shutdown",
    "spool_spans",
    "trace",
    "watch",
    "wrap",
]
