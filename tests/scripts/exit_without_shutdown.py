"""Profile, leave scopes open and return without ci.shutdown(): atexit must flush.

python exit_without_shutdown.py PATH
"""

import os
import sys

import cirron as ci

ci.profile(path=sys.argv[1], flush_interval=30.0, frameworks=[])
print(f"PID {os.getpid()}", flush=True)

for _epoch in ci.epochs(range(2)):
    for i in ci.batches(range(3)):
        ci.mark("loss", 0.5 / (i + 1))

# Left open on purpose: an epoch whose loop is still referenced, and a bare scope.
unfinished = ci.epochs(range(5))
next(unfinished)
left_open = ci.scope("left-open")
left_open.__enter__()
ci.mark("last", 1)
print("DONE", flush=True)
