"""A wall clock that moves only by the work a script says it did, for runs whose answer must
not depend on how busy the machine is.

``install()`` replaces ``time.time_ns`` before cirron and OpenTelemetry bind it (both read it
once, at import). Each reading on the main thread moves the clock 1 us on, so spans keep their
order and a length above zero; ``advance(ms)`` moves it by the work the script declares; other
threads (the flush thread) read it as it stands, so they add nothing to a step. A step that
spins for 10 ms is then 10 ms and a few microseconds long on a quiet machine or a loaded one,
while the spinning itself stays real (its CPU time is measured as usual).
"""

from __future__ import annotations

import threading
import time

_TICK_NS = 1_000
_main = threading.main_thread()
_lock = threading.Lock()
_now = [0]


def _known_time_ns() -> int:
    with _lock:
        if threading.current_thread() is _main:
            _now[0] += _TICK_NS
        return _now[0]


def install() -> None:
    """From now on ``time.time_ns`` is the known clock, starting at the real time."""
    _now[0] = time.time_ns()
    time.time_ns = _known_time_ns


def advance(milliseconds: float) -> None:
    """The clock moves on by ``milliseconds`` of declared work."""
    with _lock:
        _now[0] += int(milliseconds * 1e6)
