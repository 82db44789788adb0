"""A small training loop that waits, inside open scopes, to be signalled.

Run by tests/test_lifecycle.py as a subprocess:

    python train_signal.py PATH [--no-cirron] [--user-handler] [--catch-ki]

Epoch 0 runs four batches; epoch 1 runs two, then, inside batch 2 and an
open ``work`` scope, prints READY and sleeps until signalled (at most 20 s).
``--no-cirron`` runs the same loop without importing cirron (the baseline).
``--user-handler`` installs a SIGTERM handler before ``ci.profile()`` that
sets a stop flag; the loop then ends gracefully and the script returns.
``--catch-ki`` catches KeyboardInterrupt at top level, prints KI, re-raises.
"""

import contextlib
import os
import signal
import sys
import time

path = sys.argv[1]
args = sys.argv[2:]
stop = False
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # Started from a background job (`cmd &` in a script), which ignores Ctrl-C and makes
    # Python skip its KeyboardInterrupt handler: behave as when started from a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)

if "--no-cirron" in args:

    def epochs(iterable):
        return iterable

    batches = epochs

    def scope(name, **attributes):
        return contextlib.nullcontext()

    def mark(name, value):
        return None
else:
    import cirron as ci

    epochs, batches, scope, mark = ci.epochs, ci.batches, ci.scope, ci.mark


def on_sigterm(signum, frame):
    global stop
    stop = True
    print(f"USER-HANDLER {signal.Signals(signum).name}", flush=True)


def main():
    print(f"PID {os.getpid()}", flush=True)
    if "--user-handler" in args:
        signal.signal(signal.SIGTERM, on_sigterm)
    if "--no-cirron" not in args:
        ci.profile(path=path, flush_interval=30.0, frameworks=[])
    deadline = time.monotonic() + 20
    for epoch in epochs(range(3)):
        for i in batches(range(4)):
            with scope("work"):
                mark("loss", 1.0 / (i + 1))
                if epoch == 1 and i == 2:
                    print("READY", flush=True)
                    while not stop and time.monotonic() < deadline:
                        time.sleep(0.02)
            if stop:
                break
        if stop:
            break
    print("DONE", flush=True)


if "--catch-ki" in args:
    try:
        main()
    except KeyboardInterrupt:
        print("KI", flush=True)
        raise
else:
    main()
