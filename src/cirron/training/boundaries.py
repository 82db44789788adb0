"""Moments at training boundaries that core features hook into.

Whoever owns an ``epoch`` span (``cirron.training`` for the framework hooks,
``ci.epochs``, a framework callback) calls :func:`epoch_ending` right before
that span ends. Features that must see the model at that moment, such as
weight and gradient snapshots, register with :func:`before_epoch_end`. Each
callback runs behind the guard: a failing one is counted in ``ci.health()``,
and the epoch still ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span

from ..recording.guard import call_guarded

EpochCallback = Callable[[Any], None]

_before_epoch_end: list[tuple[str, EpochCallback]] = []


def before_epoch_end(site: str, callback: EpochCallback) -> None:
    """Call ``callback(epoch_span)`` before every epoch span ends (``site`` names it in health)."""
    if all(registered is not callback for _, registered in _before_epoch_end):
        _before_epoch_end.append((site, callback))


def epoch_ending(span: Span) -> None:
    """The epoch ``span`` is about to end: run every registered callback on it."""
    if span is None:
        return
    for site, callback in _before_epoch_end:
        call_guarded(site, callback, span)
