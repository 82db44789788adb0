"""The hot path: who records now, scopes and marks, hook spans, the guard, and the state of
the training moments that the hot path consults.

Holds the recorder of the running profiler or of the in-memory session (``recorder``),
``ci.scope``/``ci.mark`` (``scopes``), the spans the framework hooks note around a call
and build later (``hook_spans``), the one guard around foreign ground (``guard``), and the
typed state of the open epoch, step and passes (``training_state``: kept here, not with
the rules in :mod:`cirron.training`, because the hot path reads it on every scope and mark).

May import: :mod:`cirron.otel`, :mod:`cirron.exporters`, :mod:`cirron.config`, and modules
of this package.
"""
