"""cirron's own threads, made so that signals meant for the program reach its main thread.

The kernel hands a process-directed signal (Ctrl-C's SIGINT, a scheduler's SIGTERM, an alarm)
to any thread that does not block it. CPython runs Python signal handlers only in the main
thread, and wakes that thread only when the signal lands on it: a SIGINT taken by a sink
thread sets the handler's flag, but a main thread sleeping in ``time.sleep`` or waiting on a
lock keeps sleeping, and the handler (the user's, or the ``KeyboardInterrupt``) runs minutes
late. Each thread cirron starts therefore blocks these signals first, leaving them to threads
that can act on them. Faults (SIGSEGV, SIGFPE, ...) are sent to the thread that caused them
and are not blocked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

_FOR_THE_MAIN_THREAD = {
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
}


_ours = threading.local()  # .blocked: this thread blocked them itself


def _block() -> set[int | signal.Signals] | None:
    """Block the program's signals in the calling thread: the mask before, or None where
    threads have no signal mask (Windows) or the platform refuses one of them."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, _FOR_THE_MAIN_THREAD)
    except (OSError, ValueError):
        return None


def _unblock_in_child() -> None:
    # A process forked from one of these threads (an exporter's own os.fork) would start with
    # the program's signals blocked in its only thread: SIGTERM could not end it.
    if getattr(_ours, "blocked", False):
        _ours.blocked = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FOR_THE_MAIN_THREAD)


if hasattr(os, "register_at_fork") and hasattr(signal, "pthread_sigmask"):
    os.register_at_fork(after_in_child=_unblock_in_child)


def daemon_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()
) -> threading.Thread:
    """A daemon thread (not started) that runs ``target(*args)`` with the program's signals
    blocked."""

    def run() -> None:
        _ours.blocked = _block() is not None
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Block the program's signals in the calling thread for the block, so that a thread a
    library starts inside it (the SDK's metric reader) inherits the mask. A signal that
    arrives meanwhile is held by the kernel and handled as the block ends: none is lost."""
    before = _block()
    try:
        yield
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
