"""Work done ahead in a worker process, so that reading a long run uses two cores: the Chrome
export parses the next spool files there while it lays out the spans of the last one; the
questions about steps (``show --diagnose``, ``report``, ...) read, inflate and sift them
there while they hold the spans kept.

Workers forked (Linux's default start method: nothing of the user's program is imported
again, and the parsing code is there already), a few items ahead of the caller, so what is
parsed and not yet used stays bounded: one where the caller's own work on each item is the
larger part (the export's layout), two where the caller mostly waits (the sifting before
the questions about steps). A worker ignores Ctrl-C: the caller's interrupt, or any
error, ends the workers (``Pool.terminate``). Where a process cannot be made (no ``fork``, a
sandbox, no semaphores), or for a single item, the work is done in the caller's process,
the same way.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
AHEAD = 2  # items handed to each worker before the caller takes the first result


@contextlib.contextmanager
def results(
    function: Callable[[Item], Result],
    items: Sequence[Item],
    *,
    use_worker: bool = True,
    workers: int = 1,
) -> Iterator[Iterator[Result]]:
    """``function`` of each of ``items``, in order, worked out in ``workers`` worker processes
    (at most one a core) where they can be made (and ``use_worker``). Each
    worker is forked with ``function`` (whatever it holds is not pickled: a set of a million
    step ids is handed over as it is); each item and result is. The first items are handed
    over at once: the caller's work before it takes the first result runs beside theirs."""
    workers = max(1, min(workers, os.cpu_count() or 1))
    pool = _pool(function, workers) if use_worker and len(items) > 1 else None
    if pool is None:
        yield map(function, items)
        return
    with pool:  # (its exit ends the workers, whatever happened)
        yield _ahead(pool, items, AHEAD * workers)


def _pool(function: Callable[[Any], Any], workers: int) -> Any:
    """A pool of ``workers`` forked workers, or None where there is no such thing to be had."""
    if not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2:
        return None  # (elsewhere fork is not the default, and one core gains nothing)
    try:
        return multiprocessing.get_context("fork").Pool(workers, _start, (function,))
    except (OSError, ValueError, ImportError):  # no processes, no semaphores (sem_open)
        return None


_function: Callable[[Any], Any] | None = None  # in the worker: what it works out


def _start(function: Callable[[Any], Any]) -> None:
    global _function
    _function = function
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()  # what it shares with the caller stays shared: no collection walks (writes) it


def _call(item: Any) -> Any:
    assert _function is not None
    return _function(item)


def _ahead(pool: Any, items: Sequence[Item], ahead: int) -> Iterator[Any]:
    pending: collections.deque[Any] = collections.deque(
        pool.apply_async(_call, (item,)) for item in items[:ahead]
    )
    return _taken(pool, pending, items[ahead:])


def _taken(pool: Any, pending: collections.deque[Any], rest: Sequence[Item]) -> Iterator[Any]:
    for item in rest:
        pending.append(pool.apply_async(_call, (item,)))
        yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()
