"""``ci.epochs`` and ``ci.batches``: transparent iterators that open a scope per item.

Each item the inner iterable yields opens an indexed scope that stays open
until the next item is requested, the iterable is exhausted, or the loop is
left (``break``, an exception, or the wrapper being dropped). Values, their
types and their number are passed through unchanged.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from .. import training
from ..otel import semconv
from ..recording import hook_spans, hot, recorder
from ..recording.scopes import close_span, open_on
from ..recording.training_state import USER, Moment, TrainingState
from . import resources

T = TypeVar("T")

_time_ns = time.time_ns
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


class _Loop(Iterator[T]):
    """What ``ci.epochs`` and ``ci.batches`` share: a transparent iterator, one span per item.

    Each item is a training moment (:mod:`cirron.training`), the user's own.
    Like the hooks' spans, loop spans don't count toward the scope nesting
    limit: a loop adds one level.
    """

    __slots__ = ("_iterable", "_iterator", "_index", "_open")
    _function = "ci.epochs"

    def __init__(self, iterable: Iterable[T]) -> None:
        if not isinstance(iterable, Iterable) and not hasattr(iterable, "__getitem__"):
            raise TypeError(f"{self._function}() needs an iterable, got {type(iterable).__name__}")
        self._iterable = iterable
        self._iterator: Iterator[T] | None = None
        self._index = 0
        self._open: Any = None  # what the open item's span is, while there is one

    def __iter__(self) -> _Loop[T]:
        return self

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the span of the current item (done for you by the loop)."""

    def __del__(self) -> None:
        # A `break` drops the wrapper: close its open span right there.
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - never raise from a finalizer
            pass


class _Epochs(_Loop[T]):
    """``ci.epochs``: each item is an epoch of the user's."""

    __slots__ = ()

    def __next__(self) -> T:
        if self._open is not None:
            self.close()
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = iter(self._iterable)
        rec = recorder.current or recorder.active()
        item = next(iterator)  # StopIteration and errors propagate unchanged
        if rec.enabled and training.begin_epoch(USER):  # its index counts the epochs of the run
            self._open = True
        return item

    def close(self) -> None:
        if self._open is not None:
            self._open = None
            training.end_epoch(USER)


class _Batches(_Loop[T]):
    """``ci.batches``: each item is a batch, the user's step.

    It runs once per batch, so on a path of its own: one :class:`Moment` per
    loop, reused from item to item and put in the training state while its
    batch is open, and the span opened on the hooks' lean path.
    """

    __slots__ = ("_moment", "_timed")
    _function = "ci.batches"

    def __init__(self, iterable: Iterable[T]) -> None:
        super().__init__(iterable)
        self._moment: Moment | None = None
        self._timed = _is_torch_dataloader(iterable)

    def __next__(self) -> T:
        rec = recorder.current
        if rec is None:
            rec = recorder.active()
        # The batch begins where its fetch begins, and the previous one ends there: steps
        # hold their own fetch, as every owner's do.
        started = _time_ns()
        opened = self._open
        boundary = None
        if opened is not None:  # the previous batch: close() inline
            self._open = None
            state = rec.training
            if state.step is opened:
                state.step = None
            if opened.cpu is not None:  # a measured step (see resources.cpu_mark)
                boundary = resources.step_ends(opened.opened[0], opened.cpu, state)
            close_span(opened.opened, None, started)
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = iter(self._iterable)
            try:
                _driven.add(iterator)
            except TypeError:  # not weak-referenceable: a plain iterator, no hooks care
                pass
        if not rec.enabled:
            return next(iterator)
        state = rec.training
        if boundary is not None:  # measured from where the batch begins: its fetch included
            state.measured_ns = started
        elif not (state.measured_ns and 0 <= started - state.measured_ns < state.measure_every_ns):
            boundary = resources.cpu_mark(state)  # (not due, the common case, is that test)
        item = next(iterator)  # StopIteration and errors propagate unchanged
        if self._timed:
            fetched = _time_ns()
            epoch = state.epoch  # the torch hooks may have opened it inside the fetch
            began = getattr(epoch.opened[0], "start_time", None) if epoch is not None else None
            if began is not None and began > started:
                started = began
            attributes = {semconv.INDEX: self._index, semconv.DATA_LOAD_NS: fetched - started}
        else:
            attributes = {semconv.INDEX: self._index}
        if state.step is not None:  # a step another owner left open
            training.yield_step_to_user(state)
        opened = open_on(rec, semconv.BATCH, attributes, started)
        if self._timed:  # the wait for it, as the hooks record a fetch
            hook_spans.record_on(opened[0], semconv.DATA_LOAD, {}, started, fetched)
        moment = self._moment
        if moment is None:
            moment = self._moment = Moment(USER, opened, 0, None)
        else:
            moment.opened = opened
        moment.cpu = boundary
        state.step = self._open = moment
        self._index += 1
        return item

    def close(self) -> None:
        opened = self._open
        if opened is not None:
            self._open = None
            state = (recorder.current or recorder.active()).training
            if state.step is opened:
                state.step = None
            resources.step_ends(opened.opened[0], opened.cpu, state)
            close_span(opened.opened)


# The reference __next__ of ci.batches. Where the compiled helper is built, its twin runs the
# common case (past the first item, no DataLoader, no CPU measurement due or running) and
# hands the rest to this one; both give the same spans (tests/test_hot_paths.py).
PURE_NEXT = _Batches.__next__
if hot.compiled is not None:
    _this = sys.modules[__name__]
    for _module in (_this, training):
        hot.watch(_module)
    hot.compiled.configure_batches(
        batches=_Batches,
        loop=_Loop,
        state=TrainingState,
        moment=Moment,
        yield_step=training.yield_step_to_user,
        batch_name=semconv.BATCH,
        index_key=semconv.INDEX,
        patched=hot.patched,
        watched=(
            (_this, "open_on", open_on),
            (_this, "close_span", close_span),
            (_this, "_time_ns", _time_ns),
            (training, "yield_step_to_user", training.yield_step_to_user),
        ),
    )
    _Batches.__next__ = hot.compiled.Twin(5, PURE_NEXT)  # type: ignore[method-assign]


def epochs(iterable: Iterable[T]) -> Iterator[T]:
    """Yield the items of ``iterable``, each inside an ``epoch`` scope.

    ``for epoch in ci.epochs(range(20))`` yields 0..19 and records 20 ``epoch``
    spans; their ``index`` counts the epochs of the whole run, from 0.
    """
    return _Epochs(iterable)


def batches(iterable: Iterable[T]) -> Iterator[T]:
    """Yield the items of ``iterable``, each inside a ``batch`` scope.

    The ``index`` restarts at 0 for each call. For a torch ``DataLoader`` the
    time spent waiting for each batch is recorded as ``data_load_ns``.
    """
    return _Batches(iterable)
