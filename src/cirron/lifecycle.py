"""Process exit and signals: nothing recorded is lost, nothing hangs, nothing changes.

- ``atexit`` (and multiprocessing's exit finalizers, for its forked
  children, which end without ``atexit``): shut the profiler down (close
  open scopes, flush, stop threads), bounded by ``exit_timeout``.
- SIGTERM / SIGINT: if the previous handler is Python code (``KeyboardInterrupt``
  for Ctrl-C, a trainer's graceful-stop flag, ...), flush what has ended and
  hand over to it; the exception it raises closes open scopes on its way out.
  If the previous disposition is the default (the process dies), close every
  open scope with status ERROR naming the signal, flush, restore the default
  and re-send the signal, so the exit status is the one it would have been.
  An ignored signal stays ignored.

The work of a dying process runs in a helper thread joined with a timeout:
the interrupted main thread may hold a lock that work needs, and a signal
handler must never deadlock the process it is meant to end.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from .otel.threads import daemon_thread

_SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), signal.SIGINT) if s is not None)
_previous: dict[int, Any] = {}
_handler: Callable[[int, Any], None] | None = None
_exit_hook: Callable[[], None] | None = None
_multiprocessing_hook: Any = None  # a multiprocessing.util.Finalize


def _run_bounded(work: Callable[[], None], timeout: float) -> None:
    thread = daemon_thread(work, "cirron-exit")
    thread.start()
    thread.join(timeout)


def install(
    on_exit: Callable[[], None],
    on_signal: Callable[[str, bool], None],
    on_raise: Callable[[str, BaseException], None],
    timeout: float,
) -> None:
    """Register ``on_exit`` at exit and ``on_signal(name, dying)`` for SIGTERM/SIGINT.

    ``on_raise(name, error)`` runs in the interrupted thread when the previous
    handler raises (``KeyboardInterrupt``), before the exception unwinds.
    """
    global _handler, _exit_hook, _multiprocessing_hook
    _exit_hook = on_exit
    atexit.register(on_exit)
    _multiprocessing_hook = _at_multiprocessing_exit(on_exit)
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal() only works in the main thread

    owner = os.getpid()

    def handle(signum: int, frame: Any) -> None:
        previous = _previous.get(signum, signal.SIG_DFL)
        if os.getpid() == owner and previous is not signal.SIG_IGN:
            name = signal.Signals(signum).name
            dying = previous in (signal.SIG_DFL, None)
            _run_bounded(lambda: on_signal(name, dying), timeout)
        if callable(previous):
            try:
                previous(signum, frame)
            except BaseException as error:
                if os.getpid() == owner:
                    try:
                        on_raise(signal.Signals(signum).name, error)
                    except Exception:  # noqa: BLE001, S110 - the user's exception matters more
                        pass
                raise
        elif previous in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for signum in _SIGNALS:
        try:
            current = signal.getsignal(signum)
            if current is _handler and _handler is not None:
                # Ours, inherited by a forked child from its parent: chain to the
                # parent's previous handler, not to a handler that ignores the child.
                current = _previous.get(signum, signal.SIG_DFL)
            _previous[signum] = current
            signal.signal(signum, handle)
        except (ValueError, OSError):  # embedded interpreters, odd platforms
            _previous.pop(signum, None)
    _handler = handle


def _at_multiprocessing_exit(on_exit: Callable[[], None]) -> Any:
    """Also run ``on_exit`` when a multiprocessing child ends.

    A child started by fork (a ``Process``, a ``Pool`` worker) ends with
    ``os._exit()`` once its work is done: ``atexit`` never runs there, but
    multiprocessing's own finalizers do. (A child of a bare ``os.fork()`` that
    ends with ``os._exit()`` must call ``ci.shutdown()`` itself.)
    """
    if "multiprocessing" not in sys.modules:
        return None  # no multiprocessing child can be running this
    import multiprocessing.util

    return multiprocessing.util.Finalize(None, on_exit, exitpriority=10)


def uninstall() -> None:
    """Unregister the exit hooks; give each signal back its previous handler."""
    global _handler, _exit_hook, _multiprocessing_hook
    if _exit_hook is not None:
        atexit.unregister(_exit_hook)
        _exit_hook = None
    if _multiprocessing_hook is not None:
        _multiprocessing_hook.cancel()
        _multiprocessing_hook = None
    if _handler is None:
        return
    if threading.current_thread() is threading.main_thread():
        for signum, previous in list(_previous.items()):
            try:
                if signal.getsignal(signum) is _handler:
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass
    _previous.clear()
    _handler = None
