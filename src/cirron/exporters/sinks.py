"""The sinks behind the span processor: one exporter each, its own thread, a bounded queue.

A slow or hung exporter (an OTLP endpoint that never answers) only ever
delays its own thread, never the spool, the flush thread or training. What a
sink can't hold or deliver is lost *for that sink* and counted.

Every drained batch is one :class:`Delivery`, shared by all sinks. It keeps
the top-level figures of ``ci.health()`` honest: ``spans_exported`` counts
the spans every sink delivered, ``spans_dropped`` every span that some sink
lost (once, however many sinks lost it). A sink only ever loses a tail of a
batch (the spans its queue had no room for) or all of it (a failed export),
so the spans of a batch every sink still has are always a prefix of it.

The first loss of each sink is reported in one warning that says why; later
ones are counted only. A sink can also be given a ``ledger``: a function that
is told the spans it delivered (the OTLP sink's acknowledgements, kept beside
the spool, so that ``cirron export`` sends exactly the rest), and a
``replay_hint``: the command that sends what it lost, said once more at the end
of the run when it lost any.

An exporter that wrote only the first spans of a batch (the spool at its size
cap) raises :class:`PartialExport`: the rest is lost for that sink, and counted.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..otel.health import Health
from ..otel.processor import Delivery
from ..otel.spans import untraced
from ..otel.threads import daemon_thread

MAX_QUEUED_SPANS = 4096  # per sink: what a sink that can't keep up may hold in memory
SINK_THREAD_PREFIX = "cirron-sink-"
BEHIND = "it can't keep up (slow or unreachable)"  # why a sink whose queue is full loses spans
Ledger = Callable[[Sequence[ReadableSpan]], None]
_log = logging.getLogger("cirron")


class PartialExport(Exception):
    """The exporter delivered the first ``exported`` spans of the batch and no more (why: the
    message)."""

    def __init__(self, exported: int, why: str) -> None:
        super().__init__(why)
        self.exported = exported


class SinkWorker:
    """One exporter, its own thread and a bounded queue of deliveries."""

    def __init__(
        self,
        name: str,
        exporter: SpanExporter,
        health: Health,
        max_queued: int = MAX_QUEUED_SPANS,
        wait_for_room: float = 0.0,
        ledger: Ledger | None = None,
        replay_hint: str = "",
        loses_spans: bool = True,
    ) -> None:
        """``loses_spans=False``: what this sink misses is not a span lost (a sink that derives
        metrics from the spans): counted in its own ``dropped`` only, never ``spans_dropped``."""
        self.name = name
        self.loses_spans = loses_spans
        self.max_queued = max_queued
        # A local sink (a file, a stream) that is only behind is waited for, up
        # to this long, before spans for it are dropped; a network sink never is.
        self.wait_for_room = wait_for_room
        self.exporter = exporter
        self.exported = 0
        self.dropped = 0
        self.errors = 0
        self.lost_in_sink = 0  # of dropped: what reached this sink (not the ring's losses)
        self._ledger = ledger
        self._replay_hint = replay_hint  # the command that sends what this sink lost, if any
        self._health = health
        self._stuck = False
        # (delivery, how many of its spans this sink sends: a prefix)
        self._queue: collections.deque[tuple[Delivery, int]] = collections.deque()
        self._queued = 0  # spans waiting in _queue
        self._in_flight: tuple[Delivery, int] | None = None  # in the exporter right now
        self._wakeup = threading.Condition()
        self._stopping = False
        self._pid = os.getpid()
        self._thread = daemon_thread(self._run, SINK_THREAD_PREFIX + name)
        self._thread.start()

    # -- the flush thread hands batches over ----------------------------------------
    def submit(self, delivery: Delivery) -> None:
        """Queue ``delivery``; what doesn't fit under ``max_queued`` spans is lost, and counted."""
        self.ensure_running()
        count = len(delivery.spans)
        with self._wakeup:
            # An empty queue takes any batch (one ring's worth at most).
            if self._waiting() and self._waiting() + count > self.max_queued:
                # Waited for once per stall: a sink that made no room in time is
                # stuck (a hung disk) and is not waited for again until it exports.
                if self.wait_for_room > 0 and not self._stuck:
                    self._stuck = not self._wakeup.wait_for(
                        lambda: not self._waiting() or self._stopping, self.wait_for_room
                    )
            waiting = self._waiting()
            room = count if not waiting else max(self.max_queued - waiting, 0)
            if count > room:
                self._lose(delivery, room, count, BEHIND)
                count = room
            if count:
                self._queue.append((delivery, count))
                self._queued += count
                self._wakeup.notify()
            else:
                delivery.done()

    def _waiting(self) -> int:
        """Spans queued behind the batch being exported (call with ``_wakeup`` held).

        While nothing is in flight, the first queued batch is the one the sink's
        thread is about to take (it may not have been scheduled yet, in a burst
        that holds the interpreter): it doesn't count, so what a sink absorbs
        doesn't depend on when its thread gets to run.
        """
        if self._in_flight is None and self._queue:
            return self._queued - self._queue[0][1]
        return self._queued

    def count_lost_before_queue(self, spans: int) -> None:
        """Spans this sink never got (the ring was full): counted as its losses too."""
        with self._wakeup:
            self.dropped += spans

    def wait_idle(self, deadline: float) -> bool:
        """Wait until everything submitted so far is exported, or ``deadline``."""
        self.ensure_running()
        with self._wakeup:
            while self._queue or self._in_flight is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._wakeup.wait(remaining)
        return True

    def stop(self, deadline: float) -> None:
        self.wait_idle(deadline)
        try:
            self._stop(deadline)
        finally:
            if self.lost_in_sink and self._replay_hint:
                _log.warning(
                    "cirron: %d span(s) not delivered to the %s sink: run `%s` to send them",
                    self.lost_in_sink,
                    self.name,
                    self._replay_hint,
                )

    def _stop(self, deadline: float) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        try:
            with untraced():  # what an exporter sends on shutdown is ours too
                self.exporter.shutdown()
        except Exception as error:  # noqa: BLE001 - exporter failures never reach the user
            self._health.failed(f"exporter {self.name} shutdown", error, "export_errors")
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._wakeup:  # out of time: what is still queued or in flight is lost, and counted
            unfinished = list(self._queue)
            self._queue.clear()
            self._queued = 0
            if self._in_flight is not None:
                unfinished.append(self._in_flight)
                self._in_flight = None  # if that export still ends, it is not counted again
            for delivery, count in unfinished:
                self._lose(delivery, 0, count, "the process ended before they were delivered")
                delivery.done()

    # -- losses ------------------------------------------------------------------------
    def _lose(self, delivery: Delivery, index: int, count: int, why: str) -> None:
        """This sink lost ``delivery.spans[index:count]``: count it, say it once.

        Called with ``_wakeup`` held, so a flush that waits for this sink to be
        idle sees its losses counted.
        """
        lost = count - index
        self.dropped += lost
        self.lost_in_sink += lost
        if self.loses_spans:
            delivery.lost_from(index)
        recoverable = f"; the spool has them: `{self._replay_hint}` sends them"
        if not self.loses_spans:
            if why == BEHIND:  # a sink that sheds load when behind, by design: counted only
                return
            self._health.warn_once(
                f"sink-lost-{self.name}",
                "cirron: the %s sink missed %d span(s): %s. Training continues; their figures "
                "are missing from the %s; later losses are only counted",
                self.name,
                lost,
                why,
                self.name,
            )
            return
        self._health.warn_once(
            f"sink-lost-{self.name}",
            "cirron: %d span(s) did not reach the %s sink: %s. Training continues; later losses "
            "are only counted (ci.health()['spans_dropped'], ['sinks'][%r]['dropped'])%s",
            lost,
            self.name,
            why,
            self.name,
            recoverable if self._replay_hint else "",
        )

    # -- the sink's thread -------------------------------------------------------------
    def ensure_running(self) -> None:
        """Start a new thread if this sink's thread died (a backstop for :meth:`_run`)."""
        if not self._thread.is_alive() and not self._stopping and os.getpid() == self._pid:
            self._restart(RuntimeError("the thread was found dead"))

    def _restart(self, error: BaseException) -> None:
        with self._wakeup:
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                return  # restarted already
            self._thread = daemon_thread(self._run, self._thread.name)
            self._thread.start()
        self._health.thread_restarted(self._thread.name, error)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # noqa: BLE001 - e.g. an exporter's SystemExit
            if not self._stopping and os.getpid() == self._pid:
                self._restart(error)

    def _serve(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._stopping:
                    self._wakeup.wait()
                if not self._queue:
                    return
                taken = self._in_flight = self._queue.popleft()
                self._queued -= taken[1]
            try:
                self._export(taken)
            finally:
                with self._wakeup:
                    if self._in_flight is taken:  # not finished: the thread is ending
                        self._in_flight = None
                    self._stuck = False  # it moved: wait for it again when it is behind
                    self._wakeup.notify_all()

    def _export(self, taken: tuple[Delivery, int]) -> None:
        delivery, count = taken
        spans = delivery.spans if count == len(delivery.spans) else delivery.spans[:count]
        try:
            # Our own requests are not the program's: with requests, urllib3 or grpc
            # instrumented, each export would be a span of the user's trace.
            with untraced():
                result = self.exporter.export(spans)
        except PartialExport as partial:  # the first spans were written: the rest is lost
            self._acknowledged(spans[: partial.exported])
            text = self._health.failed(
                f"exporter {self.name}", partial, "export_errors", warn=False
            )
            self._finish(taken, f"export failed ({text})", partial.exported)
            return
        except Exception as error:  # noqa: BLE001 - exporter failures never reach the user
            text = self._health.failed(f"exporter {self.name}", error, "export_errors", warn=False)
            self._finish(taken, f"export failed ({text})")
            return
        except BaseException:
            self._finish(taken, "the exporter ended its thread")
            raise  # ends this thread, which _run replaces
        if result == SpanExportResult.SUCCESS:
            self._acknowledged(spans)
            self._finish(taken, None)
            return
        text = self._health.failed(
            f"exporter {self.name}",
            RuntimeError("the exporter reported FAILURE"),
            "export_errors",
            warn=False,
        )
        self._finish(taken, f"export failed ({text})")

    def _acknowledged(self, spans: Sequence[ReadableSpan]) -> None:
        if self._ledger is None:
            return
        try:
            self._ledger(spans)
        except Exception as error:  # noqa: BLE001 - the guard of our own bookkeeping
            self._health.failed(f"sink {self.name} ledger", error, "export_errors")

    def _finish(self, taken: tuple[Delivery, int], failure: str | None, exported: int = 0) -> None:
        """Count the outcome of an export of ``taken`` (``failure`` None: it succeeded;
        else the first ``exported`` spans were delivered and the rest lost)."""
        delivery, count = taken
        with self._wakeup:
            if self._in_flight is not taken:
                return  # given up on by stop(), and counted there
            self._in_flight = None
            if failure is None:
                self.exported += count
            else:
                self.errors += 1
                self.exported += exported
                self._lose(delivery, exported, count, failure)
            delivery.done()
