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
scope is made, see :mod:`cirron.training.loop_frames`).

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
:mod:`cirron.training.boundaries` (snapshots) run, once per epoch.

**Indexes.** Epochs and steps count the whole run from 0; an owner may give
its own index (HF's global step after a resume), and counting goes on from it.

The package: the rules above (``moments``: epochs and steps; ``passes``: evaluation
and frameworks' passes; ``closing``: how every moment ends; ``owners``: ranks and holds;
``fetches``: batch fetches waiting for their step), the loop wrappers ``ci.epochs`` /
``ci.batches`` (``loops``), the epoch-boundary features (``boundaries``), where the
user's loop is (``loop_frames``) and the one base of framework callback adapters
(``callbacks``).

May import: :mod:`cirron.otel`, :mod:`cirron.exporters`, :mod:`cirron.recording`,
:mod:`cirron.config`, :mod:`cirron.registry`, and modules of this package.
"""

from __future__ import annotations

from ..recording.training_state import USER, Fetch, Moment, Owner
from .fetches import fed, record_fetches, take_fetches
from .moments import (
    begin_epoch,
    begin_step,
    complete_step,
    end_completed_step,
    end_epoch,
    end_moment,
    end_step,
    epoch_boundary,
    fetch_begins_between_steps,
    logged,
    reopen_step,
    step_left_with,
    take_over,
    yield_step_to_user,
)
from .owners import epoch_of, hold, may_own, owner, release, state, step_of
from .passes import PASS_NAMES, begin_evaluation, begin_pass, end_evaluation, end_pass

__all__ = [
    "PASS_NAMES",
    "USER",
    "Fetch",
    "Moment",
    "Owner",
    "begin_epoch",
    "begin_evaluation",
    "begin_pass",
    "begin_step",
    "complete_step",
    "end_completed_step",
    "end_epoch",
    "end_evaluation",
    "end_moment",
    "end_pass",
    "end_step",
    "epoch_boundary",
    "epoch_of",
    "fed",
    "fetch_begins_between_steps",
    "hold",
    "logged",
    "may_own",
    "owner",
    "record_fetches",
    "release",
    "reopen_step",
    "state",
    "step_left_with",
    "step_of",
    "take_fetches",
    "take_over",
    "yield_step_to_user",
]
