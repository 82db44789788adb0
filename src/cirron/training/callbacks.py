"""The one base for adapters whose framework calls them back (Keras, Lightning, the HF
Trainer, trainloop): a run's life cycle, said once.

An adapter maps its framework's callbacks onto the moments of a
:class:`FrameworkRun` and keeps only what is its framework's own: which
callback is which moment, how to read what it logs, where its model is::

    run = FrameworkRun(owner, site="keras hook")
    run.begin({"epochs": 3})            # `train` opens; lower owners' moments end; levels held
    run.begin_epoch(index)              # an epoch of the framework's
    run.begin_step(index)               # a step (or a Keras batch); complete_step(), end_step()
    run.begin_pass("evaluate", {})      # `validate` inside training, else `evaluate`; test, ...
    run.count_batch()
    run.end_pass(summary=logs)          # its values become summary marks on it
    run.end(error)                      # what it opened ends, the error recorded

Every moment runs behind the core guard, counted under the adapter's ``site``
in ``ci.health()``: a failure inside cirron never reaches the framework.
Whether an ``epoch``/``step`` opens at all is :mod:`cirron.training`'s call
(ownership, holding the levels); the pass names and attributes are those of
the OTel mapping (``validate`` has its epoch's ``index``, every evaluation
pass its ``batches``).

A :class:`Switch` is an adapter's on/off: callbacks handed to a framework stay
in its lists after ``uninstrument()``, and go quiet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .. import training
from ..otel import semconv
from ..recording import recorder
from ..recording.guard import report
from ..recording.marks import marks_from
from ..recording.scopes import close_span, current_span, open_span
from ..recording.training_state import Moment, Owner

F = TypeVar("F", bound=Callable[..., Any])


class Switch:
    """An adapter's on/off: ``if ACTIVE:`` in each callback (on while instrumented)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False

    def __bool__(self) -> bool:
        return self.on


def _moment(method: F) -> F:
    """The core guard around a moment of a run, reporting under the run's ``site``."""

    @functools.wraps(method)
    def guarded(self: FrameworkRun, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the guard
            report(self.site, error)
            return None

    return guarded  # type: ignore[return-value]


class FrameworkRun:
    """One run of a framework's own loop (a ``fit()``, a ``train()``): its ``train`` span, its
    open passes, and whether its epoch's end has been announced."""

    def __init__(self, owner: Owner, site: str) -> None:
        self.owner = owner
        self.site = site  # how ci.health() names the adapter's failures
        self.train: Any = None  # the open `train` span (what close_span needs)
        self.passes: list[Moment] = []  # open passes, innermost last
        self.epoch_ending = False  # the epoch's end was announced: logs now describe it
        self._holding = False
        self._watched: list[str] = []  # models watched for this run alone (see `watching`)

    @property
    def training(self) -> bool:
        """The run's ``train`` span is open (evaluation now is validation)."""
        return self.train is not None

    # -- the run ----------------------------------------------------------------------------
    @_moment
    def begin(self, attributes: Mapping[str, Any] | None = None, hold: bool = True) -> None:
        """The run begins: what lower owners left open ends, ``train`` opens.

        ``hold``: the framework's loop has the training levels until :meth:`end`
        (an adapter that holds them around each of its calls itself says False).
        """
        if self.train is not None:
            return
        training.take_over(self.owner)
        current = training.state()
        if current.epoch is None:  # a run of its own: its epochs count from 0 (not in ci.epochs)
            current.next_epoch = 0
        if hold:
            training.hold(self.owner)
            self._holding = True
        self.train = open_span(semconv.TRAIN, dict(attributes or {}))

    @_moment
    def describe(self, attributes: Mapping[str, Any]) -> None:
        """Attributes of the run known once it began (epochs, steps, accumulation)."""
        if self.train is not None:
            for key, value in attributes.items():
                self.train[0].set_attribute(key, value)

    @_moment
    def mark_run(self, values: Mapping[str, Any]) -> None:
        """The run's final values (``train_loss``, ...) as summary marks on ``train``."""
        if self.train is not None:
            marks_from(self.train[0], values, "summary")

    @_moment
    def end(self, error: BaseException | None = None) -> None:
        """The run is over (``error``: what ended it): its passes, epoch, step and ``train`` end."""
        if self._holding:
            self._holding = False
            training.release(self.owner)
        while self.passes:
            training.end_pass(self.owner, self.passes.pop(), error)
        training.end_epoch(self.owner, error)
        training.end_step(self.owner, error)
        train, self.train = self.train, None
        if train is not None:
            close_span(train, error)
        if self._watched:  # a later run's epochs do not snapshot this run's models
            watched = (recorder.current or recorder.active()).watched
            while self._watched:
                watched.pop(self._watched.pop(), None)

    def watching(self, name: str | None) -> None:
        """The framework's hook watched model ``name`` for this run (None: it was watched
        already, with ``ci.watch``, and stays watched): its snapshots end with the run."""
        if name is not None:
            self._watched.append(name)

    # -- epochs and steps -------------------------------------------------------------------
    @_moment
    def begin_epoch(self, index: int) -> None:
        self.epoch_ending = False
        training.begin_epoch(self.owner, index=index)

    @_moment
    def epoch_ends(self, end_step: bool = True) -> None:
        """The framework says its epoch is over; it may log the epoch's values after."""
        self.epoch_ending = True
        if end_step:
            training.end_step(self.owner)

    @_moment
    def end_epoch(self, summary: Mapping[str, Any] | None = None) -> None:
        """The epoch ends, ``summary`` (its logs) as summary marks on it."""
        epoch = training.state().epoch  # the framework's, or the ci.epochs epoch it runs in
        if summary:
            target = epoch.opened[0] if epoch is not None else self.train and self.train[0]
            marks_from(target, summary, "summary")
        training.end_epoch(self.owner)

    @_moment
    def begin_step(self, index: int, name: str = semconv.STEP, start_ns: int | None = None) -> None:
        training.begin_step(self.owner, index=index, start_ns=start_ns, name=name)

    @_moment
    def complete_step(self) -> None:
        training.complete_step(self.owner)  # open for the logs that follow it

    @_moment
    def end_step(self, logs: Mapping[str, Any] | None = None) -> None:
        """The step (or batch) ends, ``logs`` as point marks on it."""
        step = training.step_of(self.owner)
        if logs:
            marks_from(step.opened[0] if step is not None else current_span(), logs, "point")
        training.end_step(self.owner)

    @_moment
    def logged(self, values: Mapping[str, Any]) -> None:
        """What the framework logged during training: point marks on the step they were
        logged in, or summary marks on the epoch once its end was announced."""
        training.logged(self.owner, values, self.epoch_ending)

    # -- passes -----------------------------------------------------------------------------
    @_moment
    def begin_pass(
        self,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        during_training: bool | None = None,
    ) -> Any:
        """A pass begins: ``evaluate`` during training is ``validate``, inside its epoch (with
        its ``index``) and never inside a step; outside training, lower owners' moments end.

        ``during_training``: whether the framework is training now, when more than this run
        knows (Keras: a ``fit()`` of any run); default: this run's ``train`` is open.
        """
        attributes = dict(attributes or {})
        if self.training if during_training is None else during_training:
            if name == semconv.EVALUATE:
                name = semconv.VALIDATE
                epoch = training.state().epoch
                if epoch is not None and not attributes.get(semconv.SANITY_CHECK):
                    attributes[semconv.INDEX] = epoch.index
            training.end_completed_step(self.owner)
        else:
            training.take_over(self.owner)
        moment = training.begin_pass(self.owner, name, attributes)
        if moment is not None:
            self.passes.append(moment)
        return moment

    @_moment
    def count_batch(self) -> None:
        if self.passes:
            self.passes[-1].batches += 1

    @_moment
    def mark_pass(self, values: Mapping[str, Any], on_epoch: bool = False) -> None:
        """An evaluation's values: summary marks on its pass (``on_epoch``: on the epoch too)."""
        if not self.passes:
            return
        marks_from(self.passes[-1].opened[0], values, "summary")
        epoch = training.epoch_of(self.owner)
        if on_epoch and epoch is not None:
            marks_from(epoch.opened[0], values, "summary")

    @_moment
    def end_pass(
        self, error: BaseException | None = None, summary: Mapping[str, Any] | None = None
    ) -> None:
        """The innermost pass ends (``summary``: its values, as summary marks on it)."""
        if not self.passes:
            return
        moment = self.passes.pop()
        if summary:
            marks_from(moment.opened[0], summary, "summary")
        training.end_pass(self.owner, moment, error)
