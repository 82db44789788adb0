"""A steady, profiled training loop that reports on itself, for the fault tests.

    python steady_train.py PATH [options]

Each batch does a fixed amount of pure-Python work (it holds the interpreter,
as a real step's Python parts do), opens ``--scopes`` child scopes with a mark
each and marks a loss; ``--batches-per-epoch`` batches make an epoch. The loop
runs ``--batches`` batches, or ``--seconds``, or until ``--stop-file`` exists.

Printed on stdout, one JSON object per line:

- ``STATUS {...}`` every ``--report-every`` seconds: ``t`` (CLOCK_MONOTONIC,
  system-wide), ``epoch``, ``batch``, ``ended`` (spans ended so far),
  ``rss_kb``, ``threads`` (OS threads), ``py_threads``, ``sinks``.
- ``TRAINED {...}`` after the loop: ``train_seconds``, ``batches``,
  ``epochs``, ``pid`` and ``health`` (``ci.health()`` before shutdown).
- ``HEALTH {...}`` after ``ci.shutdown()`` (unless ``--no-shutdown``): the
  handle's final ``health()``, every span accounted for.

``main-done-at <t>`` goes to stderr just before the script's end, so a test
can time the exit (flush and shutdown included) from outside.
"""

import argparse
import itertools
import json
import logging
import os
import sys
import threading
import time

import cirron as ci


def arguments():
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--output", default="spool")
    parser.add_argument("--flush-interval", type=float, default=0.2)
    parser.add_argument("--batches", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--batches-per-epoch", type=int, default=20)
    parser.add_argument("--scopes", type=int, default=2)
    parser.add_argument("--work", type=int, default=5000)
    parser.add_argument("--report-every", type=float, default=0.5)
    parser.add_argument("--log-file", default="")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--no-shutdown", action="store_true")
    return parser.parse_args()


def proc_status():
    """(rss_kb, threads) of this process from /proc (Linux)."""
    fields = {}
    try:
        with open("/proc/self/status") as stream:
            for line in stream:
                key, _, value = line.partition(":")
                fields[key] = value.split()
    except OSError:
        return 0, threading.active_count()
    return int(fields["VmRSS"][0]), int(fields["Threads"][0])


def report(kind, **values):
    # One write: print() writes the text and its newline separately, and the
    # stdout sink's flush thread can land a line between the two.
    sys.stdout.write(f"{kind} {json.dumps(values)}\n")
    sys.stdout.flush()


def work(amount):
    total = 0
    for i in range(amount):
        total += i * i
    return total


def status(epoch, batches, now):
    rss, threads = proc_status()
    health = ci.health()
    report(
        "STATUS",
        t=now,
        epoch=epoch,
        batch=batches,
        ended=health["spans_ended"],
        rss_kb=rss,
        threads=threads,
        py_threads=threading.active_count(),
        sinks=health["sinks"],
    )


def main():
    args = arguments()
    if args.log_file:  # every log record (the log sink's too) into a file, one a line
        handler = logging.FileHandler(args.log_file)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(args.log_level)
    handle = ci.profile(
        path=args.path,
        output=args.output.split(","),
        flush_interval=args.flush_interval,
        frameworks=[],
    )
    deadline = time.monotonic() + args.seconds if args.seconds else None
    started = next_report = time.monotonic()
    batches = 0

    def finished():
        if args.batches and batches >= args.batches:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return True
        return bool(args.stop_file) and os.path.exists(args.stop_file)

    for epoch in ci.epochs(itertools.count()):
        for _index in ci.batches(range(args.batches_per_epoch)):
            for scope in range(args.scopes):
                with ci.scope("work", index=scope, kind="compute"):
                    work(args.work)
                    ci.mark("work_ms", 0.25)
            ci.mark("loss", 1.0 / (1 + batches))
            batches += 1
            now = time.monotonic()
            if now >= next_report:
                next_report = now + args.report_every
                status(epoch, batches, now)
            if finished():
                break
        ci.mark("epoch_loss", 1.0 / (1 + epoch), kind="summary")
        if finished():
            break

    report(
        "TRAINED",
        train_seconds=time.monotonic() - started,
        batches=batches,
        epochs=epoch + 1,
        pid=os.getpid(),
        health=ci.health(),
    )
    sys.stderr.write(f"main-done-at {time.monotonic()!r}\n")
    if not args.no_shutdown:
        ci.shutdown()
        report("HEALTH", **handle.health())


if __name__ == "__main__":
    main()
