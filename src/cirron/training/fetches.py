"""Batch fetches that wait for the step they feed (see :class:`cirron.recording.training_state.Fetch`),
and their ``data_load`` spans."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span

from ..otel import semconv
from ..recording import hook_spans, recorder, training_state
from ..recording.scopes import current_span
from ..recording.training_state import Fetch

_pending = training_state.pending_fetches  # mutated in place, never rebound


def take_fetches() -> list[Fetch]:
    """The batch fetches still waiting for their step (they wait no more)."""
    if not _pending:
        return []
    count = len(_pending)  # a fetch another thread adds meanwhile stays for the next taker
    fetches = _pending[:count]
    del _pending[:count]
    return fetches


def fed(fetches: list[Fetch]) -> list[Fetch]:
    """``fetches`` without those from an iterator the program dropped before fetching on
    from another (a peek: ``next(iter(loader))``); those are recorded where the program was."""
    if len(fetches) < 2:  # a batch, fetched and used: a peek that is trained on is a step
        return fetches
    last = fetches[-1].source
    dropped = [f for f in fetches if f.source is not last and f.abandoned]
    if not dropped:
        return fetches
    record_fetches(dropped)
    return [f for f in fetches if f not in dropped]


def record_fetches(fetches: list[Fetch], parent: Span | None = None) -> None:
    """Each fetch as a ``data_load`` span under ``parent`` (None: where the program was when
    it began, the innermost open span that had begun by then).

    None under a step that ``step_sampling`` keeps without its hook spans.
    """
    here = current_span() if parent is None else parent
    current = (recorder.current or recorder.active()).training
    if not current.detail and current.step is not None and current.step.opened[0] is here:
        return
    for fetch in fetches:
        under = here if parent is not None else open_at(here, fetch.start_ns)
        hook_spans.record_on(
            under, semconv.DATA_LOAD, {}, fetch.start_ns, fetch.end_ns, fetch.error
        )


def open_at(span: Any, time_ns: int | None) -> Any:
    """``span``, or its nearest ancestor still open that had begun by ``time_ns`` (None: at
    any time); None when there is none (the session's place).

    Where the program was at a past moment (a fetch began): a span opened since (a span of
    the program's own tracer around the work on the batch) is not it, nor is one that has
    ended (another tracer's context manager can leave one current). The ancestors of a span
    of another tracer are found among the recorder's open spans, by id.
    """
    open_spans = None
    while span is not None and (
        not span.is_recording()
        or (time_ns is not None and (getattr(span, "start_time", None) or 0) > time_ns)
    ):
        above = getattr(span, "_parent_span", None)
        if above is None:
            if open_spans is None:
                rec = recorder.current
                open_spans = rec.store.open if rec is not None and rec.store is not None else {}
            context = getattr(span, "parent", None)
            above = open_spans.get(context.span_id) if context is not None else None
        span = above
    return span
