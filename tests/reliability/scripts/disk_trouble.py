"""Training while the spool's disk misbehaves.

    python disk_trouble.py PATH MODE

MODE:
- ``file-size-limit``: ``RLIMIT_FSIZE`` of 2000 bytes (with SIGXFSZ ignored,
  a write past it fails with EFBIG, as a write to a full disk fails with
  ENOSPC) during epoch 0; lifted for epoch 1, as when space is freed.
- ``cap``: nothing but the spool size cap (``CIRRON_SPOOL_MAX_BYTES`` from
  the environment).
- ``not-a-directory``: a file where the spool directory should be.
- ``read-only``: a spool directory without write permission.

Two epochs of 50 batches, a flush every 10 batches. Prints ``TRAINED {...}``
and, after ``ci.shutdown()``, ``HEALTH {...}``.
"""

import json
import os
import resource
import signal
import sys

import cirron as ci

path, mode = sys.argv[1], sys.argv[2]
if mode == "file-size-limit":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, resource.RLIM_INFINITY))
elif mode == "not-a-directory":
    with open(path, "w") as stream:
        stream.write("a file where the spool directory should be")
elif mode == "read-only":
    os.makedirs(os.path.join(path, "spool"))
    os.chmod(os.path.join(path, "spool"), 0o555)

handle = ci.profile(path=path, flush_interval=60.0, frameworks=[])
batches = 0
for epoch in ci.epochs(range(2)):
    for batch in ci.batches(range(50)):
        with ci.scope("work", index=batch, note="x" * 50):
            ci.mark("loss", 1.0 / (batch + 1))
        batches += 1
        if batch % 10 == 9:
            ci.flush()
    if mode == "file-size-limit" and epoch == 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)

print("TRAINED " + json.dumps({"batches": batches, "pid": os.getpid()}), flush=True)
ci.shutdown()
print("HEALTH " + json.dumps(handle.health()), flush=True)
