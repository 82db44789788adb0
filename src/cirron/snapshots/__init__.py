"""Weight and gradient snapshots at epoch boundaries: what is captured on the training
thread (``capture``), the snapshot thread that finishes it (``jobs``), when a boundary takes
a model's snapshot or skips it (``pacing``), what is recorded per tensor (``records``), and
``ci.watch`` (``watch``). Framework-neutral: each framework's adapter is named in
:mod:`cirron.registry` and lives with its instrumentor.

May import: :mod:`cirron.otel`, :mod:`cirron.exporters`, :mod:`cirron.recording`,
:mod:`cirron.training`, :mod:`cirron.config`, :mod:`cirron.registry`, and modules of this
package.
"""
