"""The torch hooks around data loading: each fetch from a DataLoader iterator, timed, and
the pass over its loader it belongs to (:class:`.torch_steps.LoaderPass`).

A ``DataLoader`` subclass whose own ``__iter__`` is a generator (one that
moves batches to the device, or fetches one ahead) is timed there: a fetch is
what the user's loop waits for, one ``next()`` of that generator, and the base
iterator's fetches inside it are not timed again.
"""

from __future__ import annotations

import functools
import time
import types
from typing import Any

from ..recording import hot
from ..recording.guard import guarded, report
from ..training import loops
from .torch_modules import any_seen_model_training, seen_models
from .torch_spans import SITE, torch_module
from .torch_steps import EXHAUSTED, LOOP, LoaderPass

_PASS = "_cirron_pass"  # the iterator's attribute: its LoaderPass (one per pass over a loader)
# A subclass's own iterator is fetching now: the base iterator's fetches inside it are its.
_outer_fetch = [0]
# DataLoader classes checked for an __iter__ of their own: the class that defines it -> that
# __iter__ (None: nothing of ours to undo).
_subclass_iterators: dict[type, Any] = {}


def training_now() -> bool:
    """Gradients are on and a model seen so far trains (or none was seen yet)."""
    return bool(torch_module().is_grad_enabled()) and (not seen_models or any_seen_model_training())


def _new_pass(iterator: Any, loader: Any) -> LoaderPass:
    """The pass ``iterator`` begins over ``loader`` (what all of its iterators share)."""
    training = torch_module().is_grad_enabled() and (not seen_models or any_seen_model_training())
    return LoaderPass(iterator, loader, training, loops.driven_by_batches(iterator))


def _pass_of(iterator: Any) -> LoaderPass:
    """The pass a DataLoader iterator begins (asked at its first fetch, and after a reset)."""
    sampler = getattr(iterator, "_index_sampler", None)
    loader_pass = _new_pass(iterator, sampler if sampler is not None else iterator)
    setattr(iterator, _PASS, loader_pass)
    return loader_pass


def _fetch_ends(loader_pass: LoaderPass, started: int, outcome: Any) -> None:
    try:
        LOOP.fetch_ends(loader_pass, started, outcome)
    except Exception as error:  # noqa: BLE001 - the core guard, inline on this hot path
        report(SITE, error)


def _fetch_begins(loader_pass: LoaderPass, started: int) -> None:
    try:
        LOOP.fetch_begins(loader_pass, started)
    except Exception as error:  # noqa: BLE001 - the core guard
        report(SITE, error)


def make_next(original: Any) -> Any:
    """Our ``_BaseDataLoaderIter.__next__``: each fetch timed and told to the loop; the
    compiled twin (:mod:`cirron.recording.hot`) where it is built, with this one for all
    but the next batch of a training pass."""
    time_ns = time.time_ns
    pass_of = guarded(SITE)(_pass_of)

    def __next__(self: Any) -> Any:
        if _outer_fetch[0]:  # inside a subclass's own iterator: timed there
            return original(self)
        loader_pass = self.__dict__.get(_PASS) or pass_of(self)
        if loader_pass is None:  # the guard caught a failure: the batch still comes
            return original(self)
        started = time_ns()
        try:  # the core guard, inline: once per batch
            LOOP.fetch_begins(loader_pass, started)
        except Exception as error:  # noqa: BLE001
            report(SITE, error)
        try:
            item = original(self)
        except StopIteration:
            _fetch_ends(loader_pass, started, EXHAUSTED)
            raise
        except Exception as error:
            _fetch_ends(loader_pass, started, error)
            raise
        try:  # the core guard, inline
            LOOP.fetch_ends(loader_pass, started, None)
        except Exception as error:  # noqa: BLE001
            report(SITE, error)
        return item

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    if hot.compiled is not None:  # the next batch of the same loop with no Python frame
        return hot.compiled.LoopHook(hot.FETCH_NEXT, original, __next__)
    return __next__


def make_reset(original: Any) -> Any:
    """Our ``_BaseDataLoaderIter._reset``: an iterator whose workers persist starts a new pass."""

    def _reset(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.__dict__.pop(_PASS, None)
        return original(self, *args, **kwargs)

    _reset.__wrapped__ = original  # type: ignore[attr-defined]
    return _reset


# -- DataLoader subclasses with an iterator of their own ---------------------------------------
def make_loader_init(original: Any) -> Any:
    """Our ``DataLoader.__init__``: a subclass whose ``__iter__`` is its own is timed there."""
    adopt = guarded(SITE)(_adopt)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if type(self) not in _subclass_iterators:
            adopt(type(self))

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _adopt(cls: type) -> None:
    _subclass_iterators[cls] = None
    base = torch_module().utils.data.DataLoader
    owner = next(klass for klass in cls.__mro__ if "__iter__" in klass.__dict__)
    if owner is base or owner in _subclass_iterators and _subclass_iterators[owner] is not None:
        return
    original = owner.__dict__["__iter__"]
    if getattr(original, "_cirron_times", False):
        return
    _subclass_iterators[owner] = original
    owner.__iter__ = _timed_iter(original)  # type: ignore[attr-defined]


def _timed_iter(original: Any) -> Any:
    def __iter__(self: Any) -> Any:
        inner = original(self)
        if not isinstance(inner, types.GeneratorType):
            return inner  # a DataLoader iterator (timed itself), or an iterator of its own
        holder: list[Any] = [None]
        outer = _timed(inner, holder, self)
        holder[0] = outer
        return outer

    functools.update_wrapper(__iter__, original)
    __iter__._cirron_times = True  # type: ignore[attr-defined]
    return __iter__


def _timed(inner: Any, holder: list[Any], loader: Any) -> Any:
    """``inner``'s items, each ``next()`` a fetch of the pass this generator makes."""
    time_ns = time.time_ns
    loader_pass = None
    try:
        while True:
            if _outer_fetch[0]:  # inside another one's fetch (a subclass of a subclass)
                try:
                    item = next(inner)
                except StopIteration:
                    return
                yield item
                continue
            if loader_pass is None:
                loader_pass = guarded(SITE)(_new_pass)(holder[0], loader)
            started = time_ns()
            if loader_pass is not None:
                _fetch_begins(loader_pass, started)
            _outer_fetch[0] += 1
            try:
                item = next(inner)
            except StopIteration:
                _outer_fetch[0] -= 1
                if loader_pass is not None:
                    _fetch_ends(loader_pass, started, EXHAUSTED)
                return
            except Exception as error:
                _outer_fetch[0] -= 1
                if loader_pass is not None:
                    _fetch_ends(loader_pass, started, error)
                raise
            _outer_fetch[0] -= 1
            if loader_pass is not None:
                _fetch_ends(loader_pass, started, None)
            yield item
    finally:
        inner.close()


def forget() -> None:
    """The hooks come off: every DataLoader subclass gets its own ``__iter__`` back."""
    for cls, original in _subclass_iterators.items():
        if original is not None:
            cls.__iter__ = original  # type: ignore[attr-defined]
    _subclass_iterators.clear()
    _outer_fetch[0] = 0
