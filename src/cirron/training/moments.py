"""The epochs and steps: their beginnings, the owners' reports of their work, and the checks
that end them when the program has left their loop (the rules: :mod:`cirron.training`)."""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.trace import INVALID_SPAN, Span

from ..otel import ids, semconv
from ..otel.resource import run_id
from ..otel.spans import ScopeSpan
from ..recording import recorder, training_state
from ..recording.marks import marks_from
from ..recording.recorder import Recorder
from ..recording.scopes import current_span, open_on, open_root
from ..recording.training_state import Fetch, Moment, Owner, TrainingState
from . import boundaries, loop_frames, resources
from .closing import close_epoch, close_evaluation, close_fallback_epoch, close_step, end_before
from .fetches import fed, open_at, record_fetches, take_fetches
from .owners import state, yields

_pending = training_state.pending_fetches  # mutated in place, never rebound
ROOT = INVALID_SPAN  # as a moment's parent: none (a root, on a provider with no session)


def take_over(who: Owner) -> None:
    """``who`` begins a run of its own: the epoch and step of lower owners end now."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.step is not None and current.step.owner.priority < who.priority:
            close_step(current)
        if current.epoch is not None and current.epoch.owner.priority < who.priority:
            close_epoch(current)


def begin_epoch(
    who: Owner, index: int | None = None, start_ns: int | None = None, *, fallback: bool = False
) -> bool:
    """``who``'s epoch begins (its previous one ends); False when it yields to a higher owner."""
    rec = recorder.current or recorder.active()
    current = rec.training
    with current.lock:
        step, epoch = current.step, current.epoch
        if step is not None and step.owner.priority > who.priority:
            return False  # never an epoch inside a higher owner's step (a ci.batches batch)
        if epoch is not None and epoch.owner.priority > who.priority or yields(current, who):
            return False
        # Ours, or a lower owner's: it is over (with its step), where this one begins.
        end_ns = end_before(start_ns)
        close_epoch(current, end_ns=end_ns)
        close_step(current, end_ns=end_ns)  # a step opened with no epoch around it
        if not rec.enabled:
            return False
        if start_ns is not None:  # epochs never overlap either
            start_ns = max(start_ns, current.last_epoch_end_ns)
        if index is None:
            index = current.next_epoch
        current.next_epoch = index + 1
        parent = open_at(current_span(), start_ns)
        above = parent if parent is not None else rec.session  # its parent in the tree
        if _split(rec, current, above):
            trace_id = ids.epoch_trace_id(_run_name(rec), index)
            opened = open_root(
                rec, semconv.EPOCH, {semconv.INDEX: index}, trace_id, above, start_ns
            )
        else:
            opened = open_on(rec, semconv.EPOCH, {semconv.INDEX: index}, start_ns, above or ROOT)
        epoch = current.epoch = Moment(who, opened, index, parent)
        epoch.fallback = fallback
        if parent is not None:
            training_state.enclosing.add(parent)
            epoch.encloses = True
        return True


def _split(rec: Recorder, current: TrainingState, parent: Span | None) -> bool:
    """This epoch begins a trace of its own: the run has passed ``trace_split`` spans.

    From then on every epoch does, so that no trace of a long run outgrows
    what a backend renders (its spans, the steps and snapshots inside it, go
    with it); the first epochs stay in the session's trace.
    """
    if not current.split:
        limit = rec.settings.trace_split
        # The hook spans noted but not built yet (the flush thread builds them) count too.
        noted = rec.processor.noted if rec.processor is not None else None
        recorded = rec.health.spans_started() + (len(noted) if noted is not None else 0)
        if not limit or parent is None or recorded < limit:
            return False
        current.split = True
    return parent is not None


def _run_name(rec: Recorder) -> str:
    """What names the run for its epochs' traces: the run id, else the session's trace."""
    run = run_id()
    if run is not None:
        return run
    session = rec.session
    return format(session.get_span_context().trace_id, "032x") if session is not None else ""


def end_epoch(who: Owner, error: BaseException | None = None, end_ns: int | None = None) -> None:
    """``who``'s epoch ends (with the step inside it); nothing when another owner has it.

    ``error``: what stopped the training; recorded on both (status ERROR).
    ``end_ns``: when it ended, if before now (where the next pass's first fetch began).
    """
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.epoch is not None and current.epoch.owner is who:
            close_epoch(current, error, end_ns)


def epoch_boundary(who: Owner) -> None:
    """The model is final for ``who``'s epoch: snapshots are taken now, not at its end."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        epoch = current.epoch
        if epoch is not None and epoch.owner is who and not epoch.boundary_done:
            epoch.boundary_done = True
            boundaries.epoch_ending(epoch.opened[0])


def begin_step(
    who: Owner,
    index: int | None = None,
    start_ns: int | None = None,
    *,
    fallback_epoch: bool = False,
    name: str = semconv.STEP,
    fetches: list[Fetch] | None = None,
) -> bool:
    """``who``'s step begins (its previous one ends); False when it yields to a higher owner.

    ``name``: ``"batch"`` for a framework whose steps are batches counted per
    epoch (Keras): ``index`` is then the batch's, and the run's step count
    still goes up by one.
    ``fallback_epoch``: with no epoch open, ``who`` opens one around its steps,
    and a new one every ``epoch_steps`` steps (the setting) while it owns them.
    ``fetches``: the batch fetches that feed it (default: every fetch still
    waiting, see :class:`Fetch`); it begins where the first of them began, and
    their ``data_load`` spans are its children. The previous step ends where
    this one begins: steps never overlap.
    """
    rec = recorder.current or recorder.active()
    current = rec.training
    with current.lock:
        step, epoch = current.step, current.epoch
        if step is not None and step.owner.priority > who.priority:
            return False
        if epoch is not None and epoch.owner.framework and epoch.owner.priority > who.priority:
            return False  # a framework's epoch holds its steps
        if yields(current, who):
            return False
        if fetches is None:
            fetches = fed(take_fetches())
        if fetches and (start_ns is None or fetches[0].start_ns < start_ns):
            start_ns = fetches[0].start_ns
        continued = current.step is not None  # this step begins where that one ends
        if continued:
            close_step(current, end_ns=end_before(start_ns))
        if start_ns is not None:
            start_ns = max(start_ns, current.last_step_end_ns)
        if not rec.enabled:
            return False
        if fallback_epoch and (epoch is None or epoch.fallback and epoch.owner is who):
            if epoch is None or epoch.steps >= rec.settings.epoch_steps:
                begin_epoch(who, fallback=True)
                epoch = current.epoch
        if index is None:
            index = current.next_step
        current.next_step = index + 1 if name == semconv.STEP else current.next_step + 1
        parent = here = current_span()
        above = None  # (the current span, as a step's parent nearly always is: no call)
        if here is not None and not (
            type(here) is ScopeSpan
            and here._end_time is None
            and (start_ns is None or (here._start_time or 0) <= start_ns)
        ):
            parent = open_at(here, start_ns)  # (the check above is its test, inline)
            if parent is not here:
                if epoch is not None and epoch.opened[0].is_recording():
                    parent = epoch.opened[0]  # (what opened since its fetch is in the epoch)
                above = parent or rec.session or ROOT
        opened = open_on(rec, name, {semconv.INDEX: index}, start_ns, above)
        step = current.step = Moment(who, opened, index, parent)
        if continued or start_ns == current.boundary_ns:  # where the last step ended (or a
            step.cpu = current.boundary  # fetch began with no step open): measured from there
            if step.cpu is not None:
                current.measured_ns = current.boundary_ns
        else:  # decided where it began: a fetch that was not due is not measured from here
            step.cpu = resources.cpu_mark(current, start_ns)
        if epoch is not None:
            epoch.steps += 1
        if rec.settings.step_sampling is not None:
            _sample(rec.settings.step_sampling, current, step, epoch)
        if parent is not None and (epoch is None or parent is not epoch.opened[0]):
            training_state.enclosing.add(parent)  # a user's scope around a manual loop
            step.encloses = True
        if fetches:
            record_fetches(fetches, step.opened[0])
        return True


def fetch_begins_between_steps(now: int) -> None:
    """A batch fetch begins at ``now`` with no step open (an epoch's first): the step it
    feeds, if it is to be measured, is measured from here, as its span begins here."""
    current = (recorder.current or recorder.active()).training
    if not 0 <= now - current.measured_ns < current.measure_every_ns:
        current.boundary, current.boundary_ns = resources.mark(), now


def _sample(
    sampling: tuple[int, int], current: TrainingState, step: Moment, epoch: Moment | None
) -> None:
    """``step_sampling=(K, N)``: does ``step`` keep its hook spans (the first K of its epoch,
    then every Nth)? One that does not says ``detail=false``."""
    position = epoch.steps - 1 if epoch is not None else step.index
    first, every = sampling
    current.detail = position < first or (position - first) % every == 0
    if not current.detail:
        step.opened[0].set_attribute(semconv.DETAIL, False)


def complete_step(who: Owner, loop: loop_frames.LoopPosition | None = None) -> None:
    """``who``'s step has done its work; it stays open for marks until the next one begins.

    ``loop``: the user's loop that repeats the steps; once the program has
    left it, the step ends at the next mark or scope (see the module docstring).
    """
    current = (recorder.current or recorder.active()).training
    step = current.step
    if step is None or step.owner is not who:
        return
    step.complete = True
    step.loop = loop
    if loop is not None:
        training_state.completed[0], training_state.completed[1] = step.opened[0], loop


def step_left_with(who: Owner, loop: loop_frames.LoopPosition | None) -> None:
    """``who``'s step, its optimizer moment still to come, ends once the program has left
    ``loop`` (the loop over its loader, which ran dry): checked at the next mark or scope."""
    current = (recorder.current or recorder.active()).training
    step = current.step
    if step is None or step.owner is not who or loop is None:
        return
    step.loop = loop
    training_state.completed[0], training_state.completed[1] = step.opened[0], loop


def reopen_step(who: Owner) -> None:
    """``who``'s step, reported done too early, has more work after all."""
    current = (recorder.current or recorder.active()).training
    step = current.step
    if step is not None and step.owner is who and step.complete:
        step.complete, step.loop = False, None
        if training_state.completed[0] is step.opened[0]:
            training_state.completed[0] = training_state.completed[1] = None


def end_step(who: Owner, error: BaseException | None = None, end_ns: int | None = None) -> None:
    """``who``'s step ends; nothing when another owner has it (``error``, ``end_ns``: as for
    epochs)."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.step is not None and current.step.owner is who:
            close_step(current, error, end_ns)


def end_completed_step(who: Owner) -> None:
    """``who`` begins evaluation: a step whose work is done ends here (if ``who`` may end it).

    When the program has left the loop of that step, its fallback epoch ends too:
    the evaluation after a manual loop is not in the loop's epoch.
    """
    current = (recorder.current or recorder.active()).training
    step = current.step
    if step is not None and step.complete and step.owner.priority <= who.priority:
        with current.lock:
            if current.step is step:
                left = step.loop is not None and loop_frames.left(step.loop)
                close_step(current)
                if left:
                    close_fallback_epoch(current, step.owner)


def logged(who: Owner, values: Any, epoch_ending: bool) -> None:
    """Values ``who``'s framework logged during training: where each lands is decided here.

    After the epoch's last step (``epoch_ending``: the framework logs an
    epoch's values after telling it ended), summary marks on ``who``'s epoch;
    during the epoch, point marks on ``who``'s open step (the one they were
    logged in), or on the epoch between steps.
    """
    current = (recorder.current or recorder.active()).training
    epoch, step = current.epoch, current.step
    epoch = epoch if epoch is not None and epoch.owner is who else None
    step = step if step is not None and step.owner is who else None
    if epoch_ending and epoch is not None:
        marks_from(epoch.opened[0], values, "summary")
    elif step is not None:
        marks_from(step.opened[0], values, "point")
    elif epoch is not None:
        marks_from(epoch.opened[0], values, "point")


def yield_step_to_user(current: TrainingState) -> None:
    """A ``ci.batches`` batch begins: a step some other owner left open ends first.

    The batches themselves are the user's steps; ``ci.batches`` keeps its one
    :class:`Moment` in ``current.step`` while a batch is open, on its own (its
    hot path: once per batch, no lock, no counter, the batch index is its own).
    """
    with current.lock:
        close_step(current)


def _enclosing_ends(span: Span) -> None:
    """``span`` is ending: the moments opened inside it end first (children never outlive it)."""
    current = state()
    with current.lock:
        if current.evaluation is not None and current.evaluation.parent is span:
            close_evaluation(current)
        if current.step is not None and current.step.parent is span:
            close_step(current)
        if current.epoch is not None and current.epoch.parent is span:
            close_epoch(current)
        training_state.enclosing.discard(span)


def _check_loop() -> None:
    """A mark or scope is made in a completed step (or its fallback epoch): is its loop left?

    Then that step ends, and the fallback epoch of its loop with it: what comes
    after a manual loop belongs to what encloses the loop.
    """
    current = (recorder.current or recorder.active()).training
    completed = training_state.completed
    with current.lock:
        span, loop = completed[0], completed[1]
        step, epoch = current.step, current.epoch
        if loop is None or not loop_frames.left(loop):
            return
        completed[0] = completed[1] = None
        if step is not None and step.opened[0] is span:
            close_step(current)
            close_fallback_epoch(current, step.owner)
        elif epoch is not None and epoch.opened[0] is span:
            close_epoch(current)
        elif current.evaluation is not None and current.evaluation.opened[0] is span:
            close_evaluation(current)


def end_moment(span: Span) -> bool:
    """End ``span`` as its owner would, if it is the open step or epoch (the run is ending)."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.step is not None and current.step.opened[0] is span:
            close_step(current)
            return True
        if current.epoch is not None and current.epoch.opened[0] is span:
            close_epoch(current)
            return True
        if current.evaluation is not None and current.evaluation.opened[0] is span:
            close_evaluation(current)
            return True
    return False


training_state.hooks.enclosing_end = _enclosing_ends
training_state.hooks.loop_check = _check_loop
if hasattr(os, "register_at_fork"):  # a forked child fetched none of its parent's batches
    os.register_at_fork(after_in_child=_pending.clear)
