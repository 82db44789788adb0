"""SIGTERM at every function call of a training loop's hot path, one fork each.

    python signal_sweep.py DIR

A signal can land between any two Python calls, including in the middle of
cirron's own bookkeeping (``ci.mark`` adding an event, a batch span ending,
the next one starting). For each call ``k`` made while one batch is marked,
ended and the next begun, a forked child runs the profiled loop and sends
itself SIGTERM exactly at that call (Python or C). The parent checks every child's spool
under ``DIR/<k>`` and prints one JSON object::

    {"calls": N, "results": [{"k", "status", "seconds", "problems": [...]}, ...]}

``status`` is what ``os.waitstatus_to_exitcode`` gives (``-15``: killed by
SIGTERM); ``problems`` lists what is wrong with that child's spool.
"""

import gc
import json
import os
import signal
import sys
import time

import cirron as ci

EXIT_TIMEOUT = 0.5


def train(path, fire_at):
    """The loop; returns the number of calls seen in the armed region."""
    gc.disable()  # no finalizers at random points: the same calls every run
    ci.profile(path=path, flush_interval=30.0, frameworks=[], config={"exit_timeout": EXIT_TIMEOUT})
    calls = 0

    def at_call(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            if calls == fire_at:
                os.kill(os.getpid(), signal.SIGTERM)
            calls += 1

    for epoch in ci.epochs(range(2)):
        for i in ci.batches(range(4)):
            if epoch == 1 and i == 2:
                sys.setprofile(None)
            with ci.scope("work"):
                if epoch == 1 and i == 1:
                    sys.setprofile(at_call)
                ci.mark("loss", 0.5)
    sys.setprofile(None)
    ci.shutdown()
    return calls


def problems(spans):
    found = []
    if not spans:
        return ["the spool is empty"]
    by_id = {s["spanId"]: s for s in spans}
    if len(by_id) != len(spans):
        found.append("duplicate span ids")

    def status(span):
        return span.get("status", {})

    def index(span):
        for attribute in span["attributes"]:
            if attribute["key"] == "index":
                return int(attribute["value"]["intValue"])
        return None

    for span in spans:
        parent = span.get("parentSpanId")
        if parent and parent not in by_id:
            found.append(f"{span['name']} {span['spanId']}: parent {parent} missing")
        if status(span).get("code") == 2 and "SIGTERM" not in status(span).get("message", ""):
            found.append(f"{span['name']}: error status without SIGTERM: {status(span)}")
    sessions = [s for s in spans if s["name"] == "cirron.session"]
    if len(sessions) != 1:
        return found + [f"{len(sessions)} cirron.session spans"]
    if status(sessions[0]).get("code") != 2:
        found.append("cirron.session not closed with status ERROR")
    epochs = {index(s): s for s in spans if s["name"] == "epoch"}
    if sorted(epochs) != [0, 1]:
        return found + [f"epochs {sorted(epochs)}"]
    if status(epochs[0]).get("code") == 2 or status(epochs[1]).get("code") != 2:
        found.append("epoch statuses wrong")
    for number, epoch in epochs.items():
        batches = [
            s for s in spans if s["name"] == "batch" and s.get("parentSpanId") == epoch["spanId"]
        ]
        indexes = sorted(index(s) for s in batches)
        expected = 4 if number == 0 else len(indexes)
        if indexes != list(range(expected)) or (number == 1 and len(indexes) < 2):
            found.append(f"epoch {number}: batch indexes {indexes}")
        for batch in batches:
            works = [
                s for s in spans if s["name"] == "work" and s.get("parentSpanId") == batch["spanId"]
            ]
            last = number == 1 and index(batch) == max(indexes)
            if len(works) != 1 and not (last and not works):
                found.append(f"epoch {number} batch {index(batch)}: {len(works)} work spans")
    return found


def run_child(path, fire_at):
    pid = os.fork()
    if pid == 0:
        try:
            calls = train(path, fire_at)
            with open(os.path.join(path, "calls"), "w") as stream:
                stream.write(str(calls))
        finally:
            os._exit(0)
    started = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), time.monotonic() - started
        if time.monotonic() - started > 10:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung", time.monotonic() - started
        time.sleep(0.002)


def main():
    root = sys.argv[1]
    dry = os.path.join(root, "dry")
    os.makedirs(dry)
    dry_status, _ = run_child(dry, -1)
    with open(os.path.join(dry, "calls")) as stream:
        calls = int(stream.read())
    results = []
    for k in range(calls):
        path = os.path.join(root, str(k))
        os.makedirs(path)
        status, seconds = run_child(path, k)
        results.append(
            {
                "k": k,
                "status": status,
                "seconds": round(seconds, 3),
                "problems": problems(ci.spool_spans(path)),
            }
        )
    print(json.dumps({"calls": calls, "dry_status": dry_status, "results": results}))


if __name__ == "__main__":
    main()
