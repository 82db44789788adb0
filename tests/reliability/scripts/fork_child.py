"""Fork inside a profiled loop; the child records scopes and exits.

    python fork_child.py PATH MODE
    MODE: os_exit | sys_exit | profile_again | sigterm

``sigterm``: the child profiles again and, inside an open scope, is sent SIGTERM.

The parent flushes once before forking, so spans ended before the fork are
on disk and later ones are still in the ring buffer when the child starts.
Prints ``PID <parent>`` and ``CHILD <pid> <status>``.
"""

import os
import signal
import sys

import cirron as ci

path, mode = sys.argv[1], sys.argv[2]
ci.profile(path=path, flush_interval=30.0, frameworks=[])
print(f"PID {os.getpid()}", flush=True)

with ci.scope("before-flush"):
    ci.mark("x", 1)
ci.flush()

for i in ci.batches(range(4)):
    with ci.scope("parent-work", index=i):
        ci.mark("loss", 1.0 / (i + 1))
    if i == 2:
        child = os.fork()
        if child == 0:
            for j in ci.batches(range(3)):
                with ci.scope("child-work", index=j):
                    ci.mark("child-loss", j)
            ci.flush()
            if mode == "profile_again":
                ci.profile(path=path, flush_interval=30.0, frameworks=[])
                with ci.scope("child-session-work"):
                    pass
                ci.shutdown()
            if mode == "sigterm":
                ci.profile(path=path, flush_interval=30.0, frameworks=[])
                with ci.scope("child-session-work"):
                    os.kill(os.getpid(), signal.SIGTERM)
            if mode == "os_exit":
                os._exit(0)
            sys.exit(0)
        _, status = os.waitpid(child, 0)
        print(f"CHILD {child} {os.waitstatus_to_exitcode(status)}", flush=True)

ci.shutdown()
print("DONE", flush=True)
