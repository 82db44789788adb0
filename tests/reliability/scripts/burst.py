"""A burst: back-to-back scopes as fast as the interpreter goes, past what the sinks absorb.

    python burst.py PATH COUNT

Sinks and buffers come from the environment (``CIRRON_OUTPUT``,
``CIRRON_BUFFER_SIZE``, ``OTEL_EXPORTER_OTLP_*``). After the burst the script
flushes, shuts down and prints, in one write, ``HEALTH {...}``: the handle's
final ``health()``, with ``seconds`` (the burst alone) and ``pid``.
"""

import json
import os
import sys
import time

import cirron as ci

path, count = sys.argv[1], int(sys.argv[2])
handle = ci.profile(path=path)
started = time.perf_counter()
for _ in range(count):
    with ci.scope("s"):
        pass
seconds = time.perf_counter() - started
ci.flush()
ci.shutdown()
report = dict(handle.health(), seconds=seconds, pid=os.getpid())
sys.stdout.write("HEALTH " + json.dumps(report) + "\n")
sys.stdout.flush()
