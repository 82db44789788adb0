"""Passes: the evaluation passes of a plain loop (``validate`` inside a training epoch,
``evaluate`` outside), and a framework's own (``validate``, ``evaluate``, ``test``,
``predict``, ``checkpoint``), while which lower owners open nothing."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span

from ..otel import semconv
from ..recording import recorder, training_state
from ..recording.recorder import Recorder
from ..recording.scopes import close_span, current_span, open_on
from ..recording.training_state import Fetch, LoopPosition, Moment, Owner
from .closing import close_evaluation, close_step, end_before
from .fetches import record_fetches, take_fetches
from .owners import may_own

_pending = training_state.pending_fetches  # mutated in place, never rebound
# Passes by name: a user's scope of one of these names around an evaluation loop is that pass.
PASS_NAMES = frozenset(semconv.PASSES)


def begin_evaluation(
    who: Owner,
    start_ns: int | None = None,
    fetches: list[Fetch] | None = None,
    loop: LoopPosition | None = None,
) -> Moment | None:
    """An evaluation pass of ``who``'s begins: ``validate`` inside an open training epoch
    (``index`` = the epoch's), ``evaluate`` outside training; None when ``who`` may not.

    A step still open ends first (evaluation is never inside a step); ``fetches``
    are its first batches (``batches`` counts them); ``loop``: the loop over its
    batches, so that a mark once the program has left it is not the pass's.
    """
    rec = recorder.current or recorder.active()
    current = rec.training
    with current.lock:
        if not rec.enabled or not may_own(who):
            record_fetches(fetches or [])
            return None
        if fetches and (start_ns is None or fetches[0].start_ns < start_ns):
            start_ns = fetches[0].start_ns
        end_ns = end_before(start_ns)
        close_evaluation(current, end_ns)
        if current.step is not None and current.step.owner.priority <= who.priority:
            close_step(current, end_ns=end_ns)
        epoch = current.epoch
        if start_ns is not None:
            start_ns = max(start_ns, current.last_step_end_ns)
        parent = current_span()
        if getattr(parent, "name", None) in PASS_NAMES:  # the user's ci.scope("validate"):
            record_fetches(fetches or [], parent)  # that is this pass
            return None
        evaluation = current.evaluation = _open_evaluation(rec, who, parent, epoch, start_ns)
        evaluation.loop = loop
        if loop is not None:
            training_state.completed[0] = evaluation.opened[0]
            training_state.completed[1] = loop
        if fetches:
            evaluation.batches = len(fetches)
            record_fetches(fetches, evaluation.opened[0])
        return evaluation


def _open_evaluation(
    rec: Recorder, who: Owner, parent: Span | None, epoch: Moment | None, start_ns: int | None
) -> Moment:
    """The pass's span: ``validate`` in ``epoch`` (with its index), else ``evaluate``. Inside
    a user's scope, it ends when that scope does."""
    if epoch is not None:
        opened = open_on(rec, semconv.VALIDATE, {semconv.INDEX: epoch.index}, start_ns)
    else:
        opened = open_on(rec, semconv.EVALUATE, {}, start_ns)
    evaluation = Moment(who, opened, epoch.index if epoch else 0, parent)
    if parent is not None and parent is not rec.session:
        if epoch is None or parent is not epoch.opened[0]:
            training_state.enclosing.add(parent)  # a user's scope around the evaluation loop
            evaluation.encloses = True
    return evaluation


def end_evaluation(who: Owner, end_ns: int | None = None) -> None:
    """``who``'s evaluation pass is over (its loader ran dry, or other work began)."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.evaluation is not None and current.evaluation.owner is who:
            close_evaluation(current, end_ns)


def begin_pass(who: Owner, name: str, attributes: dict[str, Any]) -> Moment | None:
    """A pass of ``who``'s framework begins (``validate``, ``evaluate``, ``test``,
    ``predict``, ``checkpoint``): its span opens, current until :func:`end_pass`.

    While it is open, lower owners open no step and no evaluation of their own.
    """
    rec = recorder.current
    if rec is None or not rec.enabled:
        return None
    current = rec.training
    with current.lock:
        if current.evaluation is not None and current.evaluation.owner.priority < who.priority:
            close_evaluation(current)
        if _pending:  # fetches before it (a training loader's last) are not the pass's
            record_fetches(take_fetches())
        step, epoch = current.step, current.epoch
        above = None
        if name == semconv.VALIDATE and step is not None and epoch is not None:
            # Validation half way through a step (Lightning's val_check_interval inside
            # gradient accumulation): the pass is the epoch's, the step goes on after it.
            above = epoch.opened[0]
        opened = open_on(rec, name, attributes, None, above)
        moment = Moment(who, opened, 0, None)
        current.passes.append(moment)
        return moment


def end_pass(who: Owner, moment: Moment, error: BaseException | None = None) -> None:
    """``moment`` (from :func:`begin_pass`) ends; with ``batches`` unless it is a checkpoint."""
    current = (recorder.current or recorder.active()).training
    if _pending:  # its loader's last fetches
        record_fetches(take_fetches(), moment.opened[0])
    with current.lock:
        passes = current.passes
        for position in range(len(passes) - 1, -1, -1):
            if passes[position] is moment:
                del passes[position]
                break
    span = moment.opened[0]
    if span.name != semconv.CHECKPOINT:
        span.set_attribute(semconv.BATCHES, moment.batches)
    close_span(moment.opened, error)
