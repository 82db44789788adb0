"""Who reports training moments, and whether one may open a moment now (the ranks and the
holds of :mod:`cirron.training`)."""

from __future__ import annotations

from .. import registry
from ..recording import recorder
from ..recording.training_state import Moment, Owner, TrainingState

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


def yields(current: TrainingState, who: Owner) -> bool:
    """A higher owner holds the levels (see :func:`hold`)."""
    holders = current.holders
    return bool(holders) and holders[-1].priority > who.priority


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
