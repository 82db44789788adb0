"""The span processor: a bounded ring in front of a background flush thread.

``on_end`` runs on the training thread, so it does O(1) work and never
blocks: the span goes into the in-memory store and into a ring buffer; when
the ring is full the span is dropped and counted. A flush thread wakes every
``flush_interval`` (or early, when the ring is half full) and hands the batch
to one sink per exporter (:class:`~cirron.exporters.sinks.SinkWorker`, behind :class:`Sink`). Each sink has its own
thread and a bounded queue, so a slow or hung exporter (an OTLP endpoint that
never answers) only ever delays itself, never the spool, the flush thread or
training.

Hook spans noted as timestamps (:mod:`cirron.recording.hook_spans`) wait in
:attr:`RingBufferSpanProcessor.noted` and are built by the flush thread
(:meth:`~RingBufferSpanProcessor.build_noted`), off the training thread; every
drain (a flush, ``ci.trace()``, shutdown, a signal) builds them first.

After ``fork()`` the child keeps the parent's objects but none of its threads:
the processor in the child drops the inherited ring and records nothing, so a
DataLoader worker neither deadlocks nor exports the parent's spans again.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from .health import Health
from .spans import DEFERRED_SEEN, ScopeSpan
from .store import TraceStore
from .threads import daemon_thread

_MAX_ROOM_WAIT = 0.25  # seconds the training thread gives a flush thread that is behind
_MAX_DEFER_SECONDS = 10.0  # how long a span may wait for a deferred attribute
NOTED_WAKE_AT = 1024  # noted hook spans that wake the flush thread early
NOTED_LIMIT = 64 * NOTED_WAKE_AT  # noted past which the training thread builds them itself
_live_processors: weakref.WeakSet[RingBufferSpanProcessor] = weakref.WeakSet()


class Delivery:
    """One batch of ended spans as every sink gets it, and what became of it."""

    __slots__ = ("spans", "_kept", "_waiting", "_health", "_lock")

    def __init__(self, spans: Sequence[ReadableSpan], sinks: int, health: Health) -> None:
        self.spans = spans
        self._kept = len(spans)  # spans[:_kept] are not lost by any sink (yet)
        self._waiting = sinks  # sinks not done with it
        self._health = health
        self._lock = threading.Lock()

    def lost_from(self, index: int) -> None:
        """A sink lost ``spans[index:]``: those not counted as lost yet now are."""
        with self._lock:
            if index < self._kept:
                self._health.add("spans_dropped", self._kept - index)
                self._kept = index

    def done(self) -> None:
        """A sink is done with the batch; after the last, what every sink kept is exported."""
        with self._lock:
            self._waiting -= 1
            if self._waiting == 0:
                self._health.add("spans_exported", self._kept)


class Sink(Protocol):
    """What the processor needs of a sink (the exporters' ``SinkWorker``)."""

    def submit(self, delivery: Delivery) -> None: ...

    def count_lost_before_queue(self, spans: int) -> None: ...

    def ensure_running(self) -> None: ...

    def wait_idle(self, deadline: float) -> bool: ...

    def stop(self, deadline: float) -> None: ...


class RingBufferSpanProcessor(SpanProcessor):
    """Bounded, non-blocking span processor feeding the store and the sinks."""

    def __init__(
        self,
        store: TraceStore,
        health: Health,
        sinks: Sequence[Sink],
        capacity: int,
        flush_interval: float,
        exit_timeout: float,
        background: bool = False,
    ) -> None:
        """``background``: run the flush thread even with no sinks, to build noted spans."""
        self.store = store
        self._open_spans = store.open
        self.sinks = list(sinks)
        self.capacity = capacity
        self._health = health
        self._started = health.started
        self._ended = health.ended
        self._ring: collections.deque[ReadableSpan] = collections.deque()
        # Hook spans that ended, as ScopeSpan.finished's arguments: built on the flush
        # thread. None when there is no flush thread: hook spans are then built at once.
        self.noted: collections.deque[tuple[Any, ...]] | None = None
        self._waiting: list[Any] = []  # drained, but waiting for a deferred attribute
        self._wake_at = max(1, capacity // 2)
        self._interval = flush_interval
        self._exit_timeout = exit_timeout  # what shutdown() may wait, when not told
        self._wakeup = threading.Event()
        self._stuck = False  # the flush thread made no room when asked; cleared by a drain
        self._drain_lock = threading.RLock()  # re-entrant: a signal handler may flush
        self._restart_lock = threading.Lock()
        self._stopped = False
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        if self.sinks or background:
            self.noted = collections.deque()
            self._thread = daemon_thread(self._run, "cirron-flush")
            self._thread.start()
        _live_processors.add(self)

    # -- training thread ------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._stopped:
            return
        next(self._started)  # health: spans_started
        # TraceStore.started, inline: this runs for every span on the training thread.
        self._open_spans[span._span_id if type(span) is ScopeSpan else span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped:
            return
        next(self._ended)  # health: spans_ended
        if self.sinks:
            ring = self._ring
            if len(ring) < self.capacity:  # _enqueue, inline while there is room
                ring.append(span)
                # Once: until the flush thread runs (it may wait for the GIL for a while),
                # every span would set the event again, taking its lock (~0.5 us).
                if len(ring) >= self._wake_at and not self._wakeup.is_set():
                    self._wakeup.set()
            else:
                self._enqueue(span, wait=True)
        # Last: while a span is still among the store's open spans, the signal
        # path knows it may not have reached the ring yet (see on_end_interrupted).
        # TraceStore.ended, inline like TraceStore.started in on_start: a call
        # less per span is ~0.15 us of an empty scope's ~2.8.
        self._open_spans.pop(
            span._span_id if type(span) is ScopeSpan else span.context.span_id, None
        )
        store = self.store
        ended = store.ended_deque
        if len(ended) == store.capacity:
            next(store.evictions)
        ended.append(span)

    def on_start_and_end(self, span: ScopeSpan, parent_context: Context | None = None) -> None:
        """``on_start`` and ``on_end`` at once, for a span built after it ended (a hook span)."""
        if self._stopped:
            return
        next(self._started)
        self.on_end(span)  # (its pop from the open spans finds nothing: it never was open)

    def noted_many(self) -> None:
        """Many hook spans wait to be built: wake the flush thread, or build them here."""
        noted = self.noted
        if noted is not None and len(noted) < NOTED_LIMIT and not self._stopped:
            self._wakeup.set()
        else:  # the flush thread is far behind (or gone): the training thread catches up
            self.build_noted()

    def build_noted(self) -> None:
        """Build the noted hook spans (any thread; each is built once)."""
        noted = self.noted
        while noted:
            try:
                record = noted.popleft()
            except IndexError:  # another thread took the last one
                return
            try:
                ScopeSpan.finished(*record)
            except Exception as error:  # noqa: BLE001 - one bad span must not stop the rest
                self._health.failed("building hook spans", error, "export_errors")

    def _make_room(self) -> bool:
        """The ring is full: spans come faster than the flush thread exports them.

        That only happens in a burst of hundreds of thousands of spans a
        second from a loop that never releases the interpreter. Rather than
        drop them, give the flush thread the GIL for up to ``_MAX_ROOM_WAIT``;
        if it made no room in that time it is stuck (a hung disk), and from
        then on spans are dropped and counted until it drains again.
        """
        if self._stuck or threading.current_thread() is self._thread:
            return False
        self._wakeup.set()
        deadline = time.monotonic() + _MAX_ROOM_WAIT
        while len(self._ring) >= self.capacity:
            if time.monotonic() >= deadline or self._stopped:
                self._stuck = True
                return False
            time.sleep(0.0002)  # releases the GIL
        return True

    def _enqueue(self, span: ReadableSpan, wait: bool) -> None:
        """Into the ring, or dropped and counted when it is full (``wait``: see _make_room)."""
        ring = self._ring
        if len(ring) >= self.capacity and not (wait and self._make_room()):
            self._health.add("spans_dropped")
            for sink in self.sinks:  # a span no sink got is every sink's loss
                sink.count_lost_before_queue(1)
            self._health.warn_once(
                "ring-full",
                "cirron: span buffer full (%d spans); dropping spans until the flush thread "
                "catches up (raise buffer_size or lower flush_interval)",
                self.capacity,
            )
            return
        ring.append(span)
        if len(ring) >= self._wake_at and not self._wakeup.is_set():
            self._wakeup.set()

    def on_end_interrupted(self, span: ReadableSpan) -> None:
        """Finish ``on_end`` for a span whose ``end()`` a signal cut short."""
        if self._stopped:
            return
        if self.sinks and not any(queued is span for queued in list(self._ring)):
            self._enqueue(span, wait=False)  # a signal handler: never wait
        self.store.ended(span)

    @property
    def buffer_used(self) -> int:
        return len(self._ring)

    # -- flush thread ---------------------------------------------------------
    def _run(self) -> None:
        try:
            self._flush_periodically()
        except BaseException as error:  # noqa: BLE001 - e.g. the thread was killed from outside
            # The dying thread starts its successor (ensure_running is the backstop).
            self._restart(error)

    def _flush_periodically(self) -> None:
        while not self._stopped:
            self._wakeup.wait(self._interval)
            self._wakeup.clear()
            if self._stopped:
                return
            try:
                self._drain()
            except Exception as error:  # noqa: BLE001 - the flush thread must not die
                self._health.failed("flush thread", error, "export_errors")

    def ensure_running(self) -> None:
        """Restart the flush thread and the sink threads if any of them died."""
        thread = self._thread
        if thread is not None and not thread.is_alive():
            self._restart(RuntimeError("the thread was found dead"))
        for sink in self.sinks:
            sink.ensure_running()

    def _restart(self, error: BaseException) -> None:
        if self._stopped or os.getpid() != self._pid:
            return
        with self._restart_lock:
            thread = self._thread
            if self._stopped or thread is None:
                return
            if thread.is_alive() and thread is not threading.current_thread():
                return  # restarted already
            self._thread = daemon_thread(self._run, thread.name)
            self._thread.start()
        self._health.thread_restarted(thread.name, error)

    def _drain(self, lock_timeout: float = -1, final: bool = False) -> int:
        if os.getpid() != self._pid:
            return 0
        # A signal handler's flush gives up on the lock after lock_timeout: the
        # thread holding it may be the one the signal froze.
        locked = self._drain_lock.acquire(timeout=lock_timeout)
        try:
            self.build_noted()
            ring = self._ring
            batch = self._waiting
            append, popleft = batch.append, ring.popleft
            try:  # what is there now; spans that end meanwhile wait for the next drain
                for _ in range(len(ring)):
                    append(popleft())
            except IndexError:  # a signal handler's flush, past the lock, took the rest
                pass
            self._stuck = False
            batch, self._waiting = self._ready(batch, final)
            if batch and self.sinks:
                delivery = Delivery(batch, len(self.sinks), self._health)
                for sink in self.sinks:
                    sink.submit(delivery)
            return len(batch)
        finally:
            if locked:
                self._drain_lock.release()

    def _ready(self, batch: list[Any], final: bool) -> tuple[list[Any], list[Any]]:
        """Split off spans whose deferred attributes (GPU time) are not known yet."""
        if not DEFERRED_SEEN[0] or not any(getattr(span, "_deferred", None) for span in batch):
            return batch, []
        give_up_before = time.time_ns() - int(_MAX_DEFER_SECONDS * 1e9)
        ready, waiting = [], []
        for span in batch:
            if getattr(span, "_deferred", None) is None or span.resolve_deferred(
                final or span.end_time < give_up_before
            ):
                ready.append(span)
            else:
                waiting.append(span)
        return ready, waiting

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        self.ensure_running()
        self._drain(final=True)
        return all([sink.wait_idle(deadline) for sink in self.sinks])

    def shutdown(self, timeout: float | None = None, interrupted: bool = False) -> None:
        """Export what is left and stop, within ``timeout`` seconds (default: ``exit_timeout``)."""
        timeout = timeout if timeout is not None else self._exit_timeout
        if self._stopped or os.getpid() != self._pid:
            self._stopped = True
            return
        deadline = time.monotonic() + timeout
        self._drain(lock_timeout=0.2 if interrupted else -1, final=True)
        self._stopped = True
        self._wakeup.set()
        for sink in self.sinks:
            sink.stop(deadline)
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def _after_fork_in_child(self) -> None:
        # The child has none of the parent's threads; what is in the ring was
        # (or will be) exported by the parent.
        self._stopped = True
        self._ring = collections.deque()
        self._waiting = []
        if self.noted is not None:
            self.noted.clear()
        self._drain_lock = threading.RLock()
        self._restart_lock = threading.Lock()
        self.sinks = []


def _after_fork_in_child() -> None:
    for processor in list(_live_processors):
        processor._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
