"""``ci.epochs`` and ``ci.batches``: transparent iterators that open a scope per item.

Each item the inner iterable yields opens an indexed scope that stays open
until the next item is requested, the iterable is exhausted, or the loop is
left (``break``, an exception, or the wrapper being dropped). Values, their
types and their number are passed through unchanged.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from . import boundaries, recorder
from .scopes import close_span, open_on

T = TypeVar("T")

_perf_ns = time.perf_counter_ns
# Iterators that ci.batches drives: framework hooks leave their steps to it.
_driven: weakref.WeakSet[Any] = weakref.WeakSet()


def driven_by_batches(iterator: Any) -> bool:
    try:
        return iterator in _driven
    except TypeError:
        return False


def _is_torch_dataloader(iterable: Any) -> bool:
    # Duck-typed so the core never imports torch.
    return any(
        cls.__name__ == "DataLoader" and cls.__module__.startswith("torch.utils.data")
        for cls in type(iterable).__mro__
    )


class _ScopedLoop(Iterator[T]):
    """The iterator behind ``ci.epochs`` / ``ci.batches``.

    The span of each item is a bare ``(span, token, context)`` tuple, the
    hooks' lean path without a Scope object: this runs once per batch. Like
    the hooks' spans, loop spans don't count toward the scope nesting limit:
    a loop adds one level.
    """

    __slots__ = ("_iterable", "_iterator", "_name", "_index", "_open", "_timed", "_is_epochs")

    def __init__(self, iterable: Iterable[T], name: str, is_epochs: bool) -> None:
        if not isinstance(iterable, Iterable) and not hasattr(iterable, "__getitem__"):
            function = "ci.epochs" if is_epochs else "ci.batches"
            raise TypeError(f"{function}() needs an iterable, got {type(iterable).__name__}")
        self._iterable = iterable
        self._iterator: Iterator[T] | None = None
        self._name = name
        self._index = 0
        self._open: tuple[Any, Any, Any] | None = None
        self._timed = not is_epochs and _is_torch_dataloader(iterable)
        self._is_epochs = is_epochs

    def __iter__(self) -> _ScopedLoop[T]:
        return self

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __next__(self) -> T:
        if self._open is not None:
            self.close()
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = iter(self._iterable)
            if not self._is_epochs:
                try:
                    _driven.add(iterator)
                except TypeError:  # not weak-referenceable: a plain iterator, no hooks care
                    pass
        rec = recorder.current
        if rec is None:
            rec = recorder.active()
        elif not rec.enabled:
            return next(iterator)
        if self._timed:
            started = _perf_ns()
            item = next(iterator)  # StopIteration and errors propagate unchanged
            attributes = {"index": self._index, "data_load_ns": _perf_ns() - started}
        else:
            item = next(iterator)
            if self._is_epochs:  # epoch indexes count the whole run
                index = rec.extras.get("epochs_started", 0)
                rec.extras["epochs_started"] = index + 1
                attributes = {"index": index}
            else:
                attributes = {"index": self._index}
        self._index += 1
        if rec.enabled:
            self._open = open_on(rec, self._name, attributes, None)
        return item

    def close(self) -> None:
        """Close the span of the current item (done for you by the loop)."""
        opened, self._open = self._open, None
        if opened is not None:
            if self._is_epochs:
                boundaries.epoch_ending(opened[0])
            close_span(opened)

    def __del__(self) -> None:
        # A `break` drops the wrapper: close its open span right there.
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - never raise from a finalizer
            pass


def epochs(iterable: Iterable[T]) -> Iterator[T]:
    """Yield the items of ``iterable``, each inside an ``epoch`` scope.

    ``for epoch in ci.epochs(range(20))`` yields 0..19 and records 20 ``epoch``
    spans; their ``index`` counts the epochs of the whole run, from 0.
    """
    return _ScopedLoop(iterable, "epoch", is_epochs=True)


def batches(iterable: Iterable[T]) -> Iterator[T]:
    """Yield the items of ``iterable``, each inside a ``batch`` scope.

    The ``index`` restarts at 0 for each call. For a torch ``DataLoader`` the
    time spent waiting for each batch is recorded as ``data_load_ns``.
    """
    return _ScopedLoop(iterable, "batch", is_epochs=False)
