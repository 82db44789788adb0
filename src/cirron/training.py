"""Training moments: the one API every loop owner reports to, and the rule of who owns what.

Loop owners (``ci.epochs``/``ci.batches``, the torch hooks, a framework's
callback) never open ``epoch`` or ``step`` spans themselves; they report
moments here::

    owner = training.owner("transformers")
    training.begin_epoch(owner, index=3)      # False: a higher owner has the epoch
    training.begin_step(owner, index=120)
    training.complete_step(owner)             # its work is done; still open for marks
    training.epoch_boundary(owner)            # the model is final for this epoch: snapshots
    training.end_epoch(owner)                 # also ends the step inside it

**Who owns the levels.** Owners rank as the user's own loops (``ci.epochs``,
``ci.batches``) above every framework, then by the registry's priority
(transformers, lightning, trainloop > tensorflow/keras > torch). A lower owner yields: its
``begin_*`` opens nothing while a higher owner's epoch (or step) is open, and
a framework's epoch also holds the steps inside it (the torch hooks open no
steps inside an HF or Keras epoch, but do inside a ``ci.epochs`` epoch, which
leaves the steps to whoever finds them). A higher owner that begins while a
lower one's epoch or step is open ends it first. An epoch never opens inside
a step. A lower owner still records its own lower-level spans (torch's
``forward``/``backward``/... under the HF ``step``).

**When they end.** An epoch ends when its owner ends it or begins the next,
when a higher owner takes the level, or when the span that enclosed it ends
(a moment never outlives its parent: a step the hooks found inside a user's
``ci.scope("setup")`` ends with that scope). Ending an epoch ends the step
inside it. A step ends when its owner ends it or begins the next; once its
work is done (:func:`complete_step`) it also ends when evaluation begins
(:func:`end_completed_step`, so validation is never inside a step) and when
the program has left the loop that repeats the steps (checked when a mark or
scope is made, see :mod:`cirron.loop_frames`).

**Holding the levels.** A framework whose own call is running (Keras's
``fit``; on the torch backend, every Keras layer call) holds the levels
(:func:`hold`/:func:`release`): lower owners open nothing meanwhile, so the
torch hooks never take a Keras layer's forward for a step of their own. A
framework that begins a run of its own first ends what lower owners left open
(:func:`take_over`), before it opens any span around its moments.

**Step sampling.** With ``step_sampling=(K, N)`` (off by default), only the
first K steps of each epoch and every Nth after keep their hook spans
(``forward``, ``backward``, ...); the others are ``step`` spans with
``detail=false`` and their marks. Epochs, steps, marks and snapshots are
always kept. Hooks ask :attr:`TrainingState.detail`.

**Epoch boundaries.** Right before an epoch ends, or earlier when its owner
says the model is final (:func:`epoch_boundary`), the features registered in
:mod:`cirron.boundaries` (snapshots) run, once per epoch.

**Indexes.** Epochs and steps count the whole run from 0; an owner may give
its own index (HF's global step after a resume), and counting goes on from it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from . import boundaries, loop_frames, registry
from .otel import ids
from .otel.resource import run_id
from .recording import hook_spans, recorder, training_state
from .recording.scopes import close_span, current_span, marks_from, open_on, open_root
from .recording.training_state import USER, Fetch, Moment, Owner, TrainingState

_time_ns = time.time_ns
_pending = training_state.pending_fetches  # mutated in place, never rebound
# Passes by name: a user's scope of one of these names around an evaluation loop is that pass.
PASS_NAMES = frozenset({"validate", "evaluate", "test", "predict"})

__all__ = [
    "USER",
    "Fetch",
    "Owner",
    "begin_epoch",
    "begin_evaluation",
    "begin_pass",
    "begin_step",
    "end_evaluation",
    "end_pass",
    "fed",
    "may_own",
    "record_fetches",
    "take_fetches",
    "end_moment",
    "complete_step",
    "end_completed_step",
    "end_epoch",
    "end_step",
    "epoch_boundary",
    "hold",
    "logged",
    "release",
    "take_over",
    "epoch_of",
    "owner",
    "reopen_step",
    "step_left_with",
    "state",
    "step_of",
    "yield_step_to_user",
]


_owners: dict[str, Owner] = {}


def owner(framework: str) -> Owner:
    """The owner that reports ``framework``'s moments (its priority from the registry)."""
    found = _owners.get(framework)
    if found is None:
        found = _owners.setdefault(
            framework, Owner(framework, registry.FRAMEWORKS[framework].priority)
        )
    return found


def state() -> TrainingState:
    """The training state of the current recorder."""
    return (recorder.current or recorder.active()).training


def epoch_of(who: Owner) -> Moment | None:
    """The open epoch if ``who`` opened it."""
    epoch = (recorder.current or recorder.active()).training.epoch
    return epoch if epoch is not None and epoch.owner is who else None


def step_of(who: Owner) -> Moment | None:
    """The open step if ``who`` opened it."""
    step = (recorder.current or recorder.active()).training.step
    return step if step is not None and step.owner is who else None


def _yields(current: TrainingState, who: Owner) -> bool:
    """A higher owner holds the levels (see :func:`hold`)."""
    holders = current.holders
    return bool(holders) and holders[-1].priority > who.priority


# -- holding the levels -------------------------------------------------------------------------
def hold(who: Owner) -> None:
    """``who``'s own work runs: lower owners open no epoch or step until :func:`release`."""
    (recorder.current or recorder.active()).training.holders.append(who)


def release(who: Owner) -> None:
    """``who``'s work that :func:`hold` announced is over."""
    holders = (recorder.current or recorder.active()).training.holders
    for position in range(len(holders) - 1, -1, -1):
        if holders[position] is who:
            del holders[position]
            return


def take_over(who: Owner) -> None:
    """``who`` begins a run of its own: the epoch and step of lower owners end now."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.step is not None and current.step.owner.priority < who.priority:
            _end_step(current)
        if current.epoch is not None and current.epoch.owner.priority < who.priority:
            _end_epoch(current)


# -- epochs ------------------------------------------------------------------------------------
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
        if epoch is not None and epoch.owner.priority > who.priority or _yields(current, who):
            return False
        # Ours, or a lower owner's: it is over (with its step), where this one begins.
        end_ns = _end_before(start_ns)
        _end_epoch(current, end_ns=end_ns)
        _end_step(current, end_ns=end_ns)  # a step opened with no epoch around it
        if not rec.enabled:
            return False
        if start_ns is not None:  # epochs never overlap either
            start_ns = max(start_ns, current.last_epoch_end_ns)
        if index is None:
            index = current.next_epoch
        current.next_epoch = index + 1
        parent = current_span()
        above = parent if parent is not None else rec.session  # its parent in the tree
        if _split(rec, current, above):
            trace_id = ids.epoch_trace_id(_run_name(rec), index)
            opened = open_root(rec, "epoch", {"index": index}, trace_id, above, start_ns)
        else:
            opened = open_on(rec, "epoch", {"index": index}, start_ns)
        epoch = current.epoch = Moment(who, opened, index, parent)
        epoch.fallback = fallback
        if parent is not None:
            training_state.enclosing.add(parent)
            epoch.encloses = True
        return True


def _split(rec: Any, current: TrainingState, parent: Any) -> bool:
    """This epoch begins a trace of its own: the run has passed ``trace_split`` spans.

    From then on every epoch does, so that no trace of a long run outgrows
    what a backend renders (its spans, the steps and snapshots inside it, go
    with it); the first epochs stay in the session's trace.
    """
    if not current.split:
        limit = rec.settings.trace_split
        if not limit or parent is None or rec.health.spans_started() < limit:
            return False
        current.split = True
    return parent is not None


def _run_name(rec: Any) -> str:
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
            _end_epoch(current, error, end_ns)


def epoch_boundary(who: Owner) -> None:
    """The model is final for ``who``'s epoch: snapshots are taken now, not at its end."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        epoch = current.epoch
        if epoch is not None and epoch.owner is who and not epoch.boundary_done:
            epoch.boundary_done = True
            boundaries.epoch_ending(epoch.opened[0])


def _end_epoch(
    current: TrainingState, error: BaseException | None = None, end_ns: int | None = None
) -> None:
    epoch = current.epoch
    if epoch is None:
        return
    _end_step(current, error, end_ns)
    _end_evaluation(current, end_ns)
    if _pending:  # its loader's last fetch, where a framework's epoch ends after it
        record_fetches(take_fetches(), epoch.opened[0])
    if not epoch.boundary_done:  # before the span ends: snapshots are its children
        epoch.boundary_done = True
        boundaries.epoch_ending(epoch.opened[0])
    current.epoch = None
    if training_state.completed[0] is epoch.opened[0]:
        training_state.completed[0] = training_state.completed[1] = None
    if epoch.encloses:
        _release(current, epoch.parent)
    end_ns = _clamped_end(epoch, end_ns)
    current.last_epoch_end_ns = end_ns
    close_span(epoch.opened, error, end_ns)


def _end_before(start_ns: int | None) -> int | None:
    """Where what is open ends when a moment begins at ``start_ns`` (None: now)."""
    if start_ns is None:
        return None
    return min(start_ns, _time_ns())


def _clamped_end(moment: Moment, end_ns: int | None) -> int:
    """``end_ns`` (None: now), never before the moment began."""
    now = _time_ns()
    if end_ns is None or end_ns > now:
        return now
    started = moment.opened[0].start_time
    return end_ns if started is None or end_ns >= started else started


# -- steps -------------------------------------------------------------------------------------
def begin_step(
    who: Owner,
    index: int | None = None,
    start_ns: int | None = None,
    *,
    fallback_epoch: bool = False,
    name: str = "step",
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
        if _yields(current, who):
            return False
        if fetches is None:
            fetches = fed(take_fetches())
        if fetches and (start_ns is None or fetches[0].start_ns < start_ns):
            start_ns = fetches[0].start_ns
        if current.step is not None:
            _end_step(current, end_ns=_end_before(start_ns))
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
        current.next_step = index + 1 if name == "step" else current.next_step + 1
        parent = current_span()
        step = current.step = Moment(
            who, open_on(rec, name, {"index": index}, start_ns), index, parent
        )
        if epoch is not None:
            epoch.steps += 1
        sampling = rec.settings.step_sampling
        if sampling is not None:
            position = epoch.steps - 1 if epoch is not None else index
            first, every = sampling
            current.detail = position < first or (position - first) % every == 0
            if not current.detail:
                step.opened[0].set_attribute("detail", False)
        if parent is not None and (epoch is None or parent is not epoch.opened[0]):
            training_state.enclosing.add(parent)  # a user's scope around a manual loop
            step.encloses = True
        if fetches:
            record_fetches(fetches, step.opened[0])
        return True


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
            _end_step(current, error, end_ns)


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
                _end_step(current)
                if left:
                    _end_fallback_epoch(current, step.owner)


def _end_step(
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
        _release(current, step.parent)
    span = step.opened[0]
    if not step.complete and span.name == "step" and span.is_recording():
        span.set_attribute("partial", True)  # it ends before its optimizer moment
    now = _time_ns()  # _clamped_end, inline: once a step
    if end_ns is None or end_ns > now:
        end_ns = now
    elif end_ns < span.start_time:
        end_ns = span.start_time
    current.last_step_end_ns = end_ns
    close_span(step.opened, error, end_ns)


def _end_fallback_epoch(current: TrainingState, who: Owner) -> None:
    epoch = current.epoch
    if epoch is not None and epoch.fallback and epoch.owner is who:
        _end_epoch(current)


# -- batch fetches ------------------------------------------------------------------------------
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


def record_fetches(fetches: list[Fetch], parent: Any = None) -> None:
    """Each fetch as a ``data_load`` span under ``parent`` (None: where the program was when
    it began, the innermost open span that had begun by then).

    None under a step that ``step_sampling`` keeps without its hook spans.
    """
    here = current_span() if parent is None else parent
    current = (recorder.current or recorder.active()).training
    if not current.detail and current.step is not None and current.step.opened[0] is here:
        return
    for fetch in fetches:
        under = here if parent is not None else _open_at(here, fetch.start_ns)
        hook_spans.record_on(under, "data_load", {}, fetch.start_ns, fetch.end_ns, fetch.error)


def _open_at(span: Any, time_ns: int) -> Any:
    """``span``, or the first of its ancestors that had begun at ``time_ns``."""
    while span is not None and (span.start_time or 0) > time_ns:
        span = getattr(span, "_parent_span", None)
    return span


def may_own(who: Owner) -> bool:
    """Whether ``who`` may open a step or an evaluation pass now (no higher owner has the
    levels: its step, its framework epoch, its own work, or an evaluation of its)."""
    current = (recorder.current or recorder.active()).training
    step, epoch, passes, holders = current.step, current.epoch, current.passes, current.holders
    priority = who.priority
    if step is not None and step.owner.priority > priority:
        return False
    if epoch is not None and epoch.owner.framework and epoch.owner.priority > priority:
        return False
    if passes and passes[-1].owner.priority > priority:
        return False
    return not holders or holders[-1].priority <= priority


# -- evaluation passes of a plain loop ------------------------------------------------------------
def begin_evaluation(
    who: Owner,
    start_ns: int | None = None,
    fetches: list[Fetch] | None = None,
    loop: loop_frames.LoopPosition | None = None,
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
        end_ns = _end_before(start_ns)
        _end_evaluation(current, end_ns)
        if current.step is not None and current.step.owner.priority <= who.priority:
            _end_step(current, end_ns=end_ns)
        epoch = current.epoch
        if start_ns is not None:
            start_ns = max(start_ns, current.last_step_end_ns)
        parent = current_span()
        if getattr(parent, "name", None) in PASS_NAMES:  # the user's ci.scope("validate"):
            record_fetches(fetches or [], parent)  # that is this pass
            return None
        if epoch is not None:
            opened = open_on(rec, "validate", {"index": epoch.index}, start_ns)
        else:
            opened = open_on(rec, "evaluate", {}, start_ns)
        evaluation = Moment(who, opened, epoch.index if epoch else 0, parent)
        current.evaluation = evaluation
        if (
            parent is not None
            and parent is not rec.session
            and (epoch is None or parent is not epoch.opened[0])
        ):
            training_state.enclosing.add(parent)  # a user's scope around the evaluation loop
            evaluation.encloses = True
        evaluation.loop = loop
        if loop is not None:
            training_state.completed[0], training_state.completed[1] = opened[0], loop
        if fetches:
            evaluation.batches = len(fetches)
            record_fetches(fetches, opened[0])
        return evaluation


def end_evaluation(who: Owner, end_ns: int | None = None) -> None:
    """``who``'s evaluation pass is over (its loader ran dry, or other work began)."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.evaluation is not None and current.evaluation.owner is who:
            _end_evaluation(current, end_ns)


def _end_evaluation(current: TrainingState, end_ns: int | None = None) -> None:
    evaluation = current.evaluation
    if evaluation is None:
        return
    current.evaluation = None
    if evaluation.encloses:
        _release(current, evaluation.parent)
    span = evaluation.opened[0]
    if training_state.completed[0] is span:
        training_state.completed[0] = training_state.completed[1] = None
    span.set_attribute("batches", evaluation.batches)
    close_span(evaluation.opened, None, _clamped_end(evaluation, end_ns))


# -- a framework's passes -----------------------------------------------------------------------
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
            _end_evaluation(current)
        if _pending:  # fetches before it (a training loader's last) are not the pass's
            record_fetches(take_fetches())
        opened = open_on(rec, name, attributes, None)
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
    if span.name != "checkpoint":
        span.set_attribute("batches", moment.batches)
    close_span(moment.opened, error)


# -- what a framework logs ----------------------------------------------------------------------
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


# -- the user's batches ---------------------------------------------------------------------
def yield_step_to_user(current: TrainingState) -> None:
    """A ``ci.batches`` batch begins: a step some other owner left open ends first.

    The batches themselves are the user's steps; ``ci.batches`` keeps its one
    :class:`Moment` in ``current.step`` while a batch is open, on its own (its
    hot path: once per batch, no lock, no counter, the batch index is its own).
    """
    with current.lock:
        _end_step(current)


# -- what encloses the moments ------------------------------------------------------------------
def _release(current: TrainingState, parent: Any) -> None:
    """``parent`` no longer encloses a moment, unless the other open one is also inside it."""
    if parent is None:
        return
    still = (current.epoch, current.step, current.evaluation)
    if all(moment is None or moment.parent is not parent for moment in still):
        training_state.enclosing.discard(parent)


def _enclosing_ends(span: Any) -> None:
    """``span`` is ending: the moments opened inside it end first (children never outlive it)."""
    current = state()
    with current.lock:
        if current.evaluation is not None and current.evaluation.parent is span:
            _end_evaluation(current)
        if current.step is not None and current.step.parent is span:
            _end_step(current)
        if current.epoch is not None and current.epoch.parent is span:
            _end_epoch(current)
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
            _end_step(current)
            _end_fallback_epoch(current, step.owner)
        elif epoch is not None and epoch.opened[0] is span:
            _end_epoch(current)
        elif current.evaluation is not None and current.evaluation.opened[0] is span:
            _end_evaluation(current)


def end_moment(span: Any) -> bool:
    """End ``span`` as its owner would, if it is the open step or epoch (the run is ending)."""
    current = (recorder.current or recorder.active()).training
    with current.lock:
        if current.step is not None and current.step.opened[0] is span:
            _end_step(current)
            return True
        if current.epoch is not None and current.epoch.opened[0] is span:
            _end_epoch(current)
            return True
        if current.evaluation is not None and current.evaluation.opened[0] is span:
            _end_evaluation(current)
            return True
    return False


training_state.hooks.enclosing_end = _enclosing_ends
training_state.hooks.loop_check = _check_loop
if hasattr(os, "register_at_fork"):  # a forked child fetched none of its parent's batches
    os.register_at_fork(after_in_child=_pending.clear)
