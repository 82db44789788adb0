"""Everything that reads a trace after the fact: ``ci.trace()``'s read-back (``readback``),
the ``cirron`` command over a spool (``cli``: show, export, the Chrome trace) and its HTML
report (``report``).

May import: :mod:`cirron.otel`, :mod:`cirron.exporters` (the spool's format, a span's line),
the recorder's type from :mod:`cirron.recording`, and modules of this package; never the
hooks, the training moments or the profiler.
"""
