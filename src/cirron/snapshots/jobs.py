"""The snapshot thread: finishes what the training thread captured at a boundary.

One daemon thread per process, started by the first job and gone after a
second of idleness. A :class:`Job` writes the raw-tensor files (when the
boundary was sampled), then puts one event per tensor on the ``snapshot``
span, and ends it. Each file is written under a temporary name and renamed,
so a reader never sees half of one; a file that can't be written (full disk,
unwritable directory, no ``safetensors``) is lost with one warning and a count
in ``ci.health()["snapshot_files_lost"]``, and the statistics still go out.

A model has at most one job in flight (:mod:`cirron.snapshots.pacing` decides
what a boundary does while it is), so the queue never holds more jobs than
there are watched models.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from ..config import Settings
from ..exporters import files
from ..otel import semconv
from ..otel.health import Health
from ..otel.threads import daemon_thread
from ..recording import recorder

_IDLE_SECONDS = 1.0
# kind of tensor -> (file name, span attribute holding its path)
FILES = {
    semconv.KIND_WEIGHT: ("weights.safetensors", semconv.SNAPSHOT_WEIGHTS_PATH),
    semconv.KIND_GRADIENT: ("gradients.safetensors", semconv.SNAPSHOT_GRADIENTS_PATH),
}


@dataclass
class Job:
    span: Span
    capture: Any  # a cirron.snapshots.capture.Capture
    health: Health
    taken_ns: int  # the boundary: every event is stamped with it
    directory: str | None  # where raw tensors go; None: stats only
    metadata: dict[str, str]
    started: float | None = None  # time.monotonic() when the snapshot thread took it up
    finished: float | None = None  # ... and when it was done (its span ended)

    def run(self) -> None:
        span = self.span
        self.started = time.monotonic()
        try:
            paths = self._write_files() if self.directory is not None else {}
            records = self.capture.records()
            for record in records:
                span.add_event(record.name, record.attributes(), self.taken_ns)
            span.set_attribute(semconv.SNAPSHOT_TENSORS, len(records))
            for attribute, path in paths.items():
                span.set_attribute(attribute, path)
        except Exception as error:  # noqa: BLE001 - the guard of the snapshot thread
            self.health.failed(semconv.SNAPSHOT, error)
            span.set_status(Status(StatusCode.ERROR, f"snapshot failed: {type(error).__name__}"))
        finally:
            self.capture.release()
            span.end()
            self.finished = time.monotonic()

    def _write_files(self) -> dict[str, str]:
        """Write each kind's file; returns {span attribute: path} of those written."""
        written = {}
        for kind, (file_name, attribute) in FILES.items():
            path = os.path.join(self.directory or "", file_name)
            metadata = {**self.metadata, semconv.TENSOR_KIND: kind}
            if _write_atomically(self.capture, kind, path, metadata, self.health):
                written[attribute] = path
        return written


def _write_atomically(
    capture: Any, kind: str, path: str, metadata: dict[str, str], health: Health
) -> bool:
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    try:
        files.make_directory(directory)
        # cirron's file mode minus the umask, as the kernel applies it (never writable by
        # others); the library writes with a mode of its own, so it is set afterwards.
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, files.FILE_MODE)
        mode = os.fstat(handle).st_mode & 0o777
        os.close(handle)
        if not capture.save(kind, temporary, metadata):
            os.remove(temporary)
            return False  # no tensors of this kind (no gradients yet)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
        return True
    except Exception as error:  # noqa: BLE001 - a lost file never stops training
        try:
            os.remove(temporary)
        except OSError:
            pass
        health.add("snapshot_files_lost")
        health.warn_once(
            "snapshot-file",
            "cirron: could not write snapshot file %s (%s: %s); raw tensors of this and later "
            "failures are lost (counted in ci.health()['snapshot_files_lost']), stats still go out",
            path,
            type(error).__name__,
            error,
        )
        return False


# -- the thread ----------------------------------------------------------------------
class _Worker:
    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.queue: collections.deque[Callable[[], None]] = collections.deque()
        self.busy = False
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()

    def submit(self, work: Callable[[], None]) -> None:
        with self.condition:
            self.queue.append(work)
            self.stopping = False
            if self.thread is None:
                self.thread = daemon_thread(self._run, "cirron-snapshots")
                self.thread.start()
            self.condition.notify_all()

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.condition:
            while not done():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.thread is None:
                    return done()
                self.condition.wait(remaining)
        return True

    def _run(self) -> None:
        while True:
            with self.condition:
                while not self.queue and not self.stopping:
                    if not self.condition.wait(_IDLE_SECONDS):
                        break
                if not self.queue:  # idle or stopped: leave; the next job starts a new thread
                    self.thread = None
                    self.condition.notify_all()
                    return
                work = self.queue.popleft()
                self.busy = True
            try:
                work()
            except Exception:  # noqa: BLE001, S110 - jobs guard themselves; never die here
                pass
            finally:
                with self.condition:
                    self.busy = False
                    self.condition.notify_all()


_worker = _Worker()


def _current() -> _Worker:
    global _worker
    if _worker.pid != os.getpid():  # a forked child: the parent's thread is not here
        _worker = _Worker()
    return _worker


def submit(job: Job) -> None:
    _current().submit(job.run)


def run_later(function: Callable[..., Any], *args: Any) -> None:
    """Run ``function(*args)`` on the snapshot thread (failures are ignored)."""
    _current().submit(lambda: function(*args))


def wait_finished(job: Job, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``job`` to be done; True when it is."""
    return _current().wait(lambda: job.finished is not None, timeout)


def drain(timeout: float) -> bool:
    """Wait until every job submitted so far is done; False on timeout."""
    worker = _current()
    return worker.wait(lambda: not worker.queue and not worker.busy, timeout)


def stop(timeout: float) -> None:
    """Finish the queued jobs (up to ``timeout``) and end the thread."""
    worker = _current()
    deadline = time.monotonic() + timeout
    drain(timeout)
    with worker.condition:
        worker.stopping = True
        worker.condition.notify_all()
        thread = worker.thread
    if thread is not None:
        thread.join(max(deadline - time.monotonic(), 0.0))


def _at_exit() -> None:
    """Finish the snapshots in flight before the interpreter tears down.

    Also without ``ci.profile()`` (an instrumentor on the user's provider): a
    daemon thread still inside torch when the interpreter finalizes aborts the
    whole process, after the user's script has ended well.
    """
    worker = _worker
    if worker.thread is not None and worker.pid == os.getpid():
        rec = recorder.current
        stop(rec.settings.exit_timeout if rec is not None else Settings().exit_timeout)


atexit.register(_at_exit)
