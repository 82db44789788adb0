"""Under OTEL_SDK_DISABLED=true, ci.profile() must be a no-op; prints a JSON report.

OTEL_SDK_DISABLED=true python sdk_disabled.py PATH
"""

import json
import os
import sys
import threading

import cirron as ci

path = sys.argv[1]
threads_before = threading.active_count()
handle = ci.profile(path=path, flush_interval=0.01)
threads_after = threading.active_count()

ran = []
for epoch in ci.epochs(range(2)):
    for i in ci.batches(range(3)):
        with ci.scope("work"):
            ran.append((epoch, i))
        ci.mark("loss", 0.1)


@ci.scope("decorated")
def double(value):
    return 2 * value


report = {
    "threads_before": threads_before,
    "threads_after": threads_after,
    "threads_end": threading.active_count(),
    "enabled": ci.health()["enabled"],
    "handle_enabled": handle.enabled,
    "ran": len(ran),
    "decorated": double(21),
}
ci.flush()
ci.shutdown()
report["exists"] = os.path.exists(path)
print(json.dumps(report), flush=True)
