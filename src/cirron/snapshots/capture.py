"""Weight and gradient snapshots at epoch boundaries (framework-neutral).

Right before an ``epoch`` span ends (see :mod:`cirron.training.boundaries`), every
watched model gets one ``snapshot`` span: a child of that epoch that also
carries a link to it, with one event per tensor (named after the parameter,
``kind`` = ``weight`` or ``gradient``) holding its ``dtype``, ``shape``,
``mean``, ``std``, ``min``, ``max``, ``norm``, a 16-bin ``histogram`` over
``histogram_range`` and the ``nan_count``/``inf_count`` of non-finite values
(the other numbers are over the finite values).

The work is split where the values could change:

- **On the training thread**, only what must happen before the next optimizer
  step: the model's adapter copies the tensors into a reused staging buffer
  (CPU), or enqueues the reductions and copies on the device's own stream
  (GPU, nothing waits for them).
- **On the snapshot thread** (:mod:`cirron.snapshots.jobs`): the statistics,
  the raw-tensor files and the span's events; then the span ends.

Modes (``ci.profile(snapshots=...)``): ``stats`` (the default) records the
events only; ``full`` also writes ``weights.safetensors`` and
``gradients.safetensors`` under ``<path>/snapshots/<span id>/`` at every
boundary; ``sampled`` does so at a boundary whose draw is below
``sample_rate``. The draw depends on the state of Python's global ``random``
and the epoch index, but never advances that generator (see
:func:`_sampled`): a script that seeds ``random`` samples the same epochs on
every run, and gets the same random numbers as without cirron. Raw files are
written only under ``ci.profile()``.

Adapters (one per framework, named in its registry entry and loaded only
once that framework is imported) turn a model into a :class:`Capture`. A
framework hook gets its models snapshotted by registering them
(:func:`cirron.snapshots.watch.register`) and reporting its epochs to
:mod:`cirron.training`, which runs the boundary.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import time
from typing import Any, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span

from .. import registry
from ..otel import semconv, spans
from ..otel.spans import ScopeSpan
from ..recording import recorder
from ..recording.recorder import Recorder
from ..training import boundaries
from . import jobs as snapshot_jobs
from . import pacing as snapshot_pacing
from .records import TensorRecord


class Capture(Protocol):
    """A model's tensors as taken at a boundary; finished on the snapshot thread."""

    tensor_count: int  # records this capture will produce

    def save(self, kind: str, path: str, metadata: dict[str, str]) -> bool:
        """Write the ``kind`` (weight/gradient) tensors to ``path``; False when there are none.

        Called before :meth:`records`, which may then reuse the copies.
        """

    def records(self) -> list[TensorRecord]:
        """One record per tensor, names unique; see :mod:`cirron.snapshots.records`."""

    def release(self) -> None:
        """Give the copies back (always called, last)."""


class Adapter(Protocol):
    def claims(self, model: Any) -> bool: ...

    def unwrap(self, model: Any) -> Any:
        """The model whose parameters to capture, inside any wrapper (DDP, compile, ...)."""

    def capture(self, model: Any, raw: bool) -> Capture: ...

    def prepare(self, model: Any, raw: bool) -> None:
        """Get ready for the first capture, off the training thread (``raw``: files may follow)."""


def adapter_for(model: Any) -> Adapter | None:
    """The adapter of the framework ``model`` belongs to (None: not a model we know)."""
    for adapter in registry.snapshot_adapters():
        if adapter.claims(model):
            return adapter  # type: ignore[no-any-return]
    return None


# -- the boundary (training thread) ------------------------------------------------
def _settings(rec: Recorder) -> tuple[str, float, str | None]:
    """(mode, sample rate, path for raw files or None) of the running profiler."""
    if not rec.writes_files:  # no ci.profile(): stats in memory, nothing written
        return "stats", 0.0, None
    settings = rec.settings
    return settings.snapshots, settings.sample_rate, settings.path


def _raw_this_boundary(mode: str, sample_rate: float, epoch: Span) -> bool:
    if mode == "full":
        return True
    return mode == "sampled" and sample_rate > 0.0 and _sampled(sample_rate, epoch)


def _sampled(sample_rate: float, epoch: Span) -> bool:
    """The boundary's draw: reproducible under the program's seed, and no draw of its own.

    Drawing from the global ``random`` would shift every number the program
    draws after it, so a seeded run would compute something else with cirron
    on. Its state is only read: a seeded run is in the same state at the same
    epoch, and the epoch index tells the boundaries of a run apart.
    """
    index = (getattr(epoch, "attributes", None) or {}).get(semconv.INDEX)
    key = index if index is not None else epoch.get_span_context().span_id
    # A digest of the state, not hash(): hash(None) (the state's gauss_next) varies by process.
    state = hashlib.blake2b(repr(random.getstate()).encode(), digest_size=8).hexdigest()
    return random.Random(f"{state}/{key}").random() < sample_rate


def _start_span(
    rec: Recorder, epoch: Span, attributes: dict[str, Any], start_ns: int, events: int
) -> Any:
    """The ``snapshot`` span: a child of ``epoch`` with a link to it, room for every event."""
    context = trace_api.set_span_in_context(epoch)
    link = epoch.get_span_context()
    if rec.lean is not None and type(epoch) is ScopeSpan:
        state = copy.copy(rec.lean)
        state.max_events = events + 16  # its own limit: no tensor lost to max_events
        span = ScopeSpan(
            semconv.SNAPSHOT, epoch._trace_id, epoch, attributes, state, context, start_ns
        )
        span.add_link(link)
        return span
    span = rec.tracer.start_span(
        semconv.SNAPSHOT,
        context=context,
        attributes=attributes,
        links=[trace_api.Link(link)],
        start_time=start_ns,
    )
    spans.widen_event_limit(span, events + 16)
    return span


def _metadata(rec: Recorder, epoch: Span, model_name: str) -> dict[str, str]:
    """What the safetensors files record besides the tensors: model, epoch, step."""
    metadata = {"model": model_name}
    index = (getattr(epoch, "attributes", None) or {}).get(semconv.INDEX)
    if index is not None:
        metadata[semconv.EPOCH] = str(index)
    steps = rec.training.next_step
    if steps:
        metadata[semconv.STEP] = str(steps)  # steps opened so far in the run
    return metadata


def _take_one(
    rec: Recorder, epoch: Span, name: str, model: Any, mode: str, directory: str | None
) -> bool:
    """Snapshot ``model`` at ``epoch``'s end; False when pacing skipped it."""
    adapter = adapter_for(model)
    if adapter is None:
        rec.health.warn_once(
            f"snapshot-{name}", "cirron: no snapshot adapter for %r; it is skipped", name
        )
        return True
    if not snapshot_pacing.ready(model, snapshot_pacing.budget(mode, directory is not None)):
        return False
    start_ns = time.time_ns()
    started = time.perf_counter()
    capture = adapter.capture(model, raw=directory is not None)
    capture_seconds = time.perf_counter() - started
    try:
        attributes = {semconv.SNAPSHOT_MODE: mode, semconv.SNAPSHOT_MODEL: name}
        span = _start_span(rec, epoch, attributes, start_ns, capture.tensor_count)
        if directory is not None:
            directory = os.path.join(directory, f"{span.get_span_context().span_id:016x}")
        job = snapshot_jobs.Job(
            span, capture, rec.health, start_ns, directory, _metadata(rec, epoch, name)
        )
    except BaseException:
        capture.release()
        raise
    snapshot_pacing.taken(model, job, capture_seconds)
    snapshot_jobs.submit(job)
    return True


def _report_skipped(rec: Recorder, epoch: Span, skipped: list[str]) -> None:
    rec.health.add("snapshots_skipped", len(skipped))
    epoch.set_attribute(semconv.SNAPSHOT_SKIPPED, skipped)
    rec.health.warn_once(
        "snapshot-skipped",
        "cirron: the snapshot of %s was still being finished at the next epoch boundary "
        "(epochs shorter than a snapshot); such boundaries skip it rather than hold training "
        "(counted in ci.health()['snapshots_skipped'], named in the epoch's snapshot.skipped)",
        ", ".join(repr(name) for name in skipped),
    )


def take(epoch: Span) -> None:
    """Snapshot every watched model; ``epoch`` is the span about to end."""
    rec = recorder.current
    if rec is None or not rec.enabled or not rec.watched or not epoch.is_recording():
        return
    mode, sample_rate, path = _settings(rec)
    raw = path is not None and _raw_this_boundary(mode, sample_rate, epoch)
    directory = os.path.abspath(os.path.join(path, "snapshots")) if raw and path else None
    skipped = []
    for name, model in rec.watched_models().items():
        try:
            if not _take_one(rec, epoch, name, model, mode, directory):
                skipped.append(name)
        except Exception as error:  # noqa: BLE001 - one model's failure spares the others
            rec.health.failed(semconv.SNAPSHOT, error)
    if skipped:
        _report_skipped(rec, epoch, skipped)


def prepare(model: Any) -> None:
    """A model was just watched: let its adapter get ready, off the training thread."""
    adapter = adapter_for(model)
    rec = recorder.current
    if adapter is not None and rec is not None:
        mode, _, path = _settings(rec)
        snapshot_jobs.run_later(adapter.prepare, model, mode != "stats" and path is not None)


def drain(timeout: float) -> bool:
    """Wait (up to ``timeout`` seconds) until every snapshot taken so far is finished."""
    return snapshot_jobs.drain(timeout)


boundaries.before_epoch_end(semconv.SNAPSHOT, take)
