"""What a step cost the machine, on its span: the training thread's CPU time and its wait for
a CPU that others held (Linux), the process's memory, and (a probe a framework registers)
the device memory it peaked at.

Read at the step boundaries only, on the training thread, and cheaply (about 2 us a
step): one ``time.thread_time_ns()`` at each boundary (the step that ends and the one
that begins share it) and one read of ``/proc/self/statm`` from a file kept open
(Linux; elsewhere ``getrusage``'s peak, which is what that platform offers at this
price); on Linux, one read of the thread's ``/proc/thread-self/schedstat``, whose run
delay says how long it was ready to run but another thread or process held the CPU. A
step's CPU time covers its span: from where it begins, its batch's fetch (the
previous step ends there, or :func:`cirron.training.fetch_begins_between_steps` marks the
fetch of an epoch's first step), so the user's work on the batch before the forward is
its own. A step that ends on another thread than the one it began on (the process is
ending) has no CPU time: a thread's clock says nothing of another's.

Device probes (:func:`add_device_probe`) are the frameworks' own: the torch hooks
register one that reads CUDA's allocator peaks and resets them, with no device
synchronisation. A probe that fails is dropped for the run and warned about once.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from opentelemetry.trace import Span

from ..otel import semconv
from ..recording.guard import call_guarded
from ..recording.training_state import TrainingState

_thread_time_ns = time.thread_time_ns
_time_ns = time.time_ns  # (the steps' own clock: a mark is compared with their beginnings)
_get_ident = threading.get_ident
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM_BYTES = 64  # the first two of /proc/self/statm's numbers (size, resident) fit
# Where a measured step begins or ends: (thread, its CPU clock, its wait for a CPU; -1: unknown).
Mark = tuple[int, int, int]
# A device probe: the figures of the step that ends (attribute -> value), its counters reset.
DeviceProbe = Callable[[], dict[str, int]]
_probes: list[tuple[DeviceProbe, Callable[[], None] | None]] = []  # (read, reset)


class _Memory:
    """The process's resident memory, from a file descriptor kept open per process.

    The file is read with libc's ``pread`` called through ``ctypes.PyDLL``, which keeps the
    interpreter held for the microsecond the kernel takes (``os.pread`` would release it):
    a training thread that lets go of the interpreter at every step hands it to the sink
    threads in a way that slows them (a thread that waits for it back can wait a whole
    switch interval, 5 ms), and the log sink then fell behind a pure-Python loop.
    ``os.pread`` where that libc call is not to be had."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0
        self._read: Callable[[int], bytes] = _os_read

    def rss_bytes(self) -> int | None:
        if self._pid != os.getpid():  # first use, or a forked child: its own file
            self._open()
        if self._fd is None:
            return _peak_rss()
        try:
            return int(self._read(self._fd).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            self._fd = None
            return None

    def _open(self) -> None:
        self._pid = os.getpid()
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._fd = None
            return
        self._read = _held_read() or _os_read


def _os_read(fd: int) -> bytes:
    return os.pread(fd, _STATM_BYTES, 0)


def _held_read() -> Callable[[int], bytes] | None:
    """A read of the first bytes of ``fd`` through libc's ``pread``, the interpreter held."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        pread = ctypes.PyDLL(None).pread
        pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
        pread.restype = ctypes.c_ssize_t
        buffer = ctypes.create_string_buffer(_STATM_BYTES)
    except (ImportError, OSError, AttributeError):
        return None

    def read(fd: int) -> bytes:
        count = pread(fd, buffer, _STATM_BYTES, 0)
        if count < 0:
            raise OSError("pread of /proc/self/statm failed")
        return buffer.raw[:count]

    return read


def _peak_rss() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


memory = _Memory()


class _RunDelay:
    """How long this thread has been ready to run but waited for a CPU (ns): the second
    figure of ``/proc/thread-self/schedstat`` (Linux), from a file each thread keeps open
    for itself (:class:`_ThreadFile`). -1 where the kernel does not say. Sleeping, I/O and
    waiting on a lock are not in it: it tells a thread that was preempted from one that
    waited.

    One file per thread, never one shared: threads that measured steps at once (16 threads
    of ``ci.batches``) each closed the shared file to open their own, two of them sometimes
    the same one, and the second close then closed whatever file had just been given that
    number: a spool file being written (``Bad file descriptor``, its spans lost)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def ns(self) -> int:
        file = getattr(self._local, "file", None)
        if file is None or file.pid != os.getpid():  # first use here, or a forked child
            file = self._local.file = _ThreadFile()
        if file.fd is None:
            return -1
        try:
            return int(file.read(file.fd).split()[1])
        except (OSError, ValueError, IndexError):
            file.close()
            return -1


class _ThreadFile:
    """``/proc/thread-self/schedstat`` as the thread that opened it reads it: closed when the
    thread's data goes (the thread ended) or when a forked child opens its own."""

    __slots__ = ("fd", "pid", "read")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.read: Callable[[int], bytes] = _os_read
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, AttributeError):  # not Linux, or no scheduler statistics
            self.fd = None
            return
        self.read = _held_read() or _os_read  # its own buffer: no other thread reads into it

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, os may be gone already
            pass


run_delay = _RunDelay()


def cpu_mark(state: TrainingState, began_ns: int | None = None) -> Mark | None:
    """Where a step that begins now begins on this thread: (thread, its CPU clock) when the
    step is to be measured, else None.

    A step is measured when ``state.measure_every_ns`` have passed since the last measured
    step began (the ``step_resources_interval`` setting; 0: every step). Each reading is a
    system call that costs microseconds in a step's context (the thread's CPU clock about
    5 us, ``/proc/self/statm`` up to 20 us on a VM), a few percent of a 2 ms step if taken
    at every one: so a run of short steps carries the figures on one step every interval,
    each exact for its step, and a step as long as the interval or longer carries them
    always."""
    now = _time_ns()
    # (The wall clock, as the steps' beginnings: one set back measures the next step.) Asked
    # where the step began (``began_ns``: its fetch, when that was not due and so not marked):
    # a step that falls due only after it began is not measured from a later point.
    since = now if began_ns is None else began_ns
    if state.measured_ns and 0 <= since - state.measured_ns < state.measure_every_ns:
        return None
    state.measured_ns = now
    return mark()


def mark() -> Mark:
    """(this thread, its CPU clock, its wait for a CPU so far) where a measured step begins;
    its device peaks start here."""
    for _, reset in _probes:
        if reset is not None:
            call_guarded("resetting a device's memory peaks at a step", reset)
    return _get_ident(), _thread_time_ns(), run_delay.ns()


def step_ends(span: Span, began: Mark | None, state: TrainingState) -> Mark | None:
    """Put a measured step's figures on ``span`` (it is about to end; ``began``: its
    :func:`cpu_mark`, None when it is not measured). Returns the CPU mark the next step of
    this thread begins at, when that one is to be measured too (the readings are shared):
    whoever begins that step there sets ``state.measured_ns`` to its beginning."""
    if began is None:
        return None
    ended = (_get_ident(), _thread_time_ns(), run_delay.ns())
    if began[0] == ended[0]:
        span.set_attribute(semconv.CPU_NS, ended[1] - began[1])
        if began[2] >= 0 and ended[2] >= 0:
            span.set_attribute(semconv.CPU_WAIT_NS, ended[2] - began[2])
    rss = memory.rss_bytes()
    if rss is not None:
        span.set_attribute(semconv.PROCESS_MEMORY_USAGE, rss)
    for entry in _probes:
        figures = call_guarded("reading a device's memory at a step", entry[0])
        if figures is None:
            _probes.remove(entry)  # it failed: warned once by the guard, not tried again
            break
        for name, value in figures.items():
            span.set_attribute(name, value)
    if 0 <= _time_ns() - state.measured_ns < state.measure_every_ns:
        return None
    return ended


def add_device_probe(probe: DeviceProbe, reset: Callable[[], None] | None = None) -> None:
    """Read ``probe`` at the end of every measured step, and call ``reset`` as one begins
    (the peaks of that step alone); once, however often it is added."""
    if all(entry[0] is not probe for entry in _probes):
        _probes.append((probe, reset))


def remove_device_probe(probe: DeviceProbe) -> None:
    _probes[:] = [entry for entry in _probes if entry[0] is not probe]
