"""How moments end: the rules every ending follows, whoever ends it.

A step ends with ``partial`` when its optimizer moment never came; nothing ends
after it began; the next moment never begins before the last one ended; an
epoch ends the step and the evaluation inside it, its boundary (snapshots) runs
first, and the fetches still waiting are its own.
"""

from __future__ import annotations

import time

from opentelemetry.trace import Span

from ..otel import semconv
from ..recording import training_state
from ..recording.scopes import close_span
from ..recording.training_state import Moment, Owner, TrainingState
from . import boundaries, resources
from .fetches import record_fetches, take_fetches

_time_ns = time.time_ns
_pending = training_state.pending_fetches  # mutated in place, never rebound


def end_before(start_ns: int | None) -> int | None:
    """Where what is open ends when a moment begins at ``start_ns`` (None: now)."""
    if start_ns is None:
        return None
    return min(start_ns, _time_ns())


def clamped_end(moment: Moment, end_ns: int | None) -> int:
    """``end_ns`` (None: now), never before the moment began."""
    now = _time_ns()
    if end_ns is None or end_ns > now:
        return now
    started = getattr(moment.opened[0], "start_time", None)  # (none: a span a sampler dropped)
    return end_ns if started is None or end_ns >= started else started


def close_step(
    current: TrainingState, error: BaseException | None = None, end_ns: int | None = None
) -> None:
    step = current.step
    if step is None:
        return
    current.step = None
    current.detail = True
    completed = training_state.completed
    if completed[0] is step.opened[0]:
        completed[0] = completed[1] = None
    epoch = current.epoch
    if step.loop is not None and epoch is not None and epoch.fallback:
        # The fallback epoch of a manual loop ends once the program leaves that loop:
        # from now on, a mark or scope in it checks.
        epoch.loop = step.loop
        completed[0], completed[1] = epoch.opened[0], step.loop
    if step.encloses:
        release_parent(current, step.parent)
    span = step.opened[0]
    now = _time_ns()
    if span.is_recording():
        if not step.complete and span.name == semconv.STEP:
            span.set_attribute(semconv.PARTIAL, True)  # it ends before its optimizer moment
        # (not measured, nor the next one: nothing to read, and no call, at most steps)
        cpu = step.cpu
        if cpu is not None:
            current.boundary = resources.step_ends(span, cpu, current)
        elif not 0 <= now - current.measured_ns < current.measure_every_ns:  # (wall clock)
            current.boundary = resources.mark()  # the next step is measured, from here
        else:
            current.boundary = None
    else:
        current.boundary = None
    # _clamped_end, inline: once a step
    if end_ns is None or end_ns > now:
        end_ns = now
    else:
        started = getattr(span, "start_time", None)  # (none: a span a sampler dropped)
        if started is not None and end_ns < started:
            end_ns = started
    current.last_step_end_ns = current.boundary_ns = end_ns
    close_span(step.opened, error, end_ns)


def close_epoch(
    current: TrainingState, error: BaseException | None = None, end_ns: int | None = None
) -> None:
    epoch = current.epoch
    if epoch is None:
        return
    close_step(current, error, end_ns)
    close_evaluation(current, end_ns)
    if _pending:  # its loader's last fetch, where a framework's epoch ends after it
        record_fetches(take_fetches(), epoch.opened[0])
    if not epoch.boundary_done:  # before the span ends: snapshots are its children
        epoch.boundary_done = True
        boundaries.epoch_ending(epoch.opened[0])
    current.epoch = None
    if training_state.completed[0] is epoch.opened[0]:
        training_state.completed[0] = training_state.completed[1] = None
    if epoch.encloses:
        release_parent(current, epoch.parent)
    end_ns = clamped_end(epoch, end_ns)
    current.last_epoch_end_ns = end_ns
    close_span(epoch.opened, error, end_ns)


def close_evaluation(current: TrainingState, end_ns: int | None = None) -> None:
    evaluation = current.evaluation
    if evaluation is None:
        return
    current.evaluation = None
    if evaluation.encloses:
        release_parent(current, evaluation.parent)
    span = evaluation.opened[0]
    if training_state.completed[0] is span:
        training_state.completed[0] = training_state.completed[1] = None
    span.set_attribute(semconv.BATCHES, evaluation.batches)
    close_span(evaluation.opened, None, clamped_end(evaluation, end_ns))


def close_fallback_epoch(current: TrainingState, who: Owner) -> None:
    epoch = current.epoch
    if epoch is not None and epoch.fallback and epoch.owner is who:
        close_epoch(current)


def release_parent(current: TrainingState, parent: Span | None) -> None:
    """``parent`` no longer encloses a moment, unless the other open one is also inside it."""
    if parent is None:
        return
    still = (current.epoch, current.step, current.evaluation)
    if all(moment is None or moment.parent is not parent for moment in still):
        training_state.enclosing.discard(parent)
