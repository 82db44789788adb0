"""What the training moments know of one run: who reports them, the open epoch, step and passes.

Kept apart from the rules (:mod:`cirron.training`) so that the recorder can
hold a :class:`TrainingState` and the scope code can consult it without an
import cycle. Nothing here opens or closes a span.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

# A loop of the user's code, running in one frame (cirron.training.loop_frames): (id of the frame, its
# code object, the bytecode offsets of the loop's first instruction and of its backward jump).
# A plain tuple: one is made per step.
LoopPosition = tuple[int, CodeType, int, int]


@dataclass(frozen=True, eq=False)
class Owner:
    """Who reports a training moment: the user's loops, or a framework's hooks.

    One instance per owner (compared by identity): :func:`cirron.training.owner`.
    """

    name: str  # "user", or the framework's name in the registry
    priority: int  # higher wins the epoch and step levels
    framework: bool = True  # a framework's epochs hold their steps; the user's don't


# ci.epochs / ci.batches: above every framework (registry priorities are small numbers).
USER = Owner("user", 1_000_000, framework=False)


class Moment:
    """An open epoch or step."""

    __slots__ = (
        "owner",
        "opened",
        "index",
        "parent",
        "complete",
        "loop",
        "fallback",
        "steps",
        "boundary_done",
        "encloses",
        "batches",
        "cpu",
    )

    def __init__(self, owner: Owner, opened: tuple[Any, Any, Any], index: int, parent: Any) -> None:
        self.owner = owner
        self.opened = opened  # (span, context token, previous context): what close_span needs
        self.index = index
        self.parent = parent  # the span that was current when it opened
        self.complete = False  # a step whose work is done (it stays open for marks)
        self.loop: LoopPosition | None = None  # the user's loop that repeats the steps
        self.fallback = False  # an epoch opened only because steps had none (epoch_steps)
        self.steps = 0  # an epoch's steps so far
        self.boundary_done = False  # an epoch whose boundary (snapshots) already ran
        self.encloses = False  # its parent is in `enclosing` on its account
        self.batches = 0  # an evaluation pass's batches so far
        self.cpu: tuple[int, int, int] | None = None  # (thread, CPU clock, CPU wait) at its start


@dataclass(slots=True)
class Fetch:
    """A batch fetch that happened before the step it feeds was known.

    Its ``data_load`` span is recorded once an owner says where it belongs
    (:func:`cirron.training.begin_step` takes the waiting fetches, so a step
    begins where its first fetch began); ``source`` is what the fetching
    hook knows of it (the torch hooks: the loader pass).
    """

    start_ns: int
    end_ns: int
    error: BaseException | None = None
    source: Any = None

    @property
    def abandoned(self) -> bool:
        """The program dropped what it fetched from (``next(iter(loader))``): no step's."""
        return bool(getattr(self.source, "abandoned", False))


@dataclass(slots=True)
class TrainingState:
    """The open epoch and step of one recorder, and the run's counters."""

    epoch: Moment | None = None
    step: Moment | None = None
    next_epoch: int = 0  # the index the next epoch gets (whole run)
    next_step: int = 0  # the index the next step gets (whole run)
    split: bool = False  # the run passed trace_split spans: each epoch is a trace of its own
    # Hook spans (forward, backward, ...) are recorded: False in a step step_sampling leaves out.
    detail: bool = True
    # An evaluation pass of a plain loop (torch's `validate`/`evaluate`), open while it runs.
    evaluation: Moment | None = None
    # Passes a framework opened (validate, evaluate, test, predict, checkpoint), innermost last.
    passes: list[Moment] = field(default_factory=list)
    # When the last step ended: the next one never begins before (steps never overlap).
    last_step_end_ns: int = 0
    last_epoch_end_ns: int = 0
    # (thread, its CPU clock, its CPU wait) where the next step is measured from when it begins at
    # boundary_ns: where the last step ended, or a fetch began with no step open (a step's
    # CPU time covers its span, its batch's fetch included). None: that step is not measured.
    boundary: tuple[int, int, int] | None = None
    boundary_ns: int = 0
    # Steps that carry their CPU time and memory (cirron.training.resources): one when this
    # long has passed since the last such step began (the setting, in ns), and when that was
    # (time.time_ns, as the steps' beginnings).
    measure_every_ns: int = 100_000_000
    measured_ns: int = 0
    # Owners whose own work is running now (a Keras fit(), a Keras layer's call): while
    # one holds the levels, lower owners open no epoch or step. Innermost last.
    holders: list[Owner] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)


# -- what the scope code consults on its hot path -------------------------------------------
# Spans that enclose an open epoch or step (a user's scope around a manual loop): when one
# of them ends, what it encloses ends first. Mutated in place, never rebound.
enclosing: set[Any] = set()
# A completed step of a manual loop, or its fallback epoch once the step ended, or an evaluation
# pass of a plain loop: (its span, the loop that repeats its batches), to check at the next mark
# or scope whether the program has left that loop; [None, None] when there is nothing to check.
completed: list[Any] = [None, None]
# Hook spans noted but not built yet (cirron.recording.hook_spans), any thread: a scope or mark has the
# ones of its thread built first. Mutated in place, never rebound; empty between hook calls.
open_hook_spans: list[Any] = []
# Batch fetches whose step is not known yet (see Fetch). Here, not on the TrainingState, so that
# a scope or mark finds them with one read: the user's code between a fetch and the first work
# on the batch (a `ci.scope("augment")`) makes the hooks decide first, so it lands in the step.
# Mutated in place, never rebound; empty but for the moment between a fetch and its work.
pending_fetches: list[Fetch] = []


def nothing(*_args: Any) -> None:
    """What a hook does until the module behind it is imported."""
    return None


@dataclass
class Hooks:
    """What the scope code calls into :mod:`cirron.training` and :mod:`cirron.recording.hook_spans` for
    (each set when its module is imported)."""

    enclosing_end: Callable[[Any], None] = nothing  # a span in `enclosing` is ending
    loop_check: Callable[[], None] = nothing  # a mark or scope in the `completed` step
    build_hook_spans: Callable[[], None] = nothing  # something nests in `open_hook_spans`
    # A user's scope or mark comes while `pending_fetches` wait: the fetching hooks decide now.
    settle_fetches: Callable[[], None] = nothing


hooks = Hooks()
