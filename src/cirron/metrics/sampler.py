"""The system sampler: one background thread that reads CPU, memory and GPUs every interval.

Every ``metrics_interval`` seconds (1 s by default) the thread reads the process's CPU
time and resident memory and, when ``nvidia-ml-py`` finds NVIDIA GPUs, each visible GPU's
utilisation and memory, into one :class:`Sample`. The observable instruments read the
latest sample when a metric reader collects; every sample is also kept for
``ci.metrics()``. Nothing here runs on the training thread.

Readers (:class:`ProcessReader`): ``os.times()`` for CPU time, ``/proc/self/statm`` kept open
for RSS on Linux, psutil (the ``metrics`` extra) for RSS where there is no ``/proc``, else
``getrusage``'s peak, rather than no figure at all. GPUs: NVML through ``nvidia-ml-py``, for the GPUs ``CUDA_VISIBLE_DEVICES``
names (by index or UUID) or all of them; NVML's utilisation is the share of the last
sample period in which a kernel ran. A reader that fails is warned about once and left
out from then on; the thread goes on.

A sample costs some tens of microseconds of the thread's CPU (more with GPUs): at 1 s,
under 0.1 % of a core (``benchmarks/metrics.py`` measures it; :attr:`SystemSampler.cpu_ns` is
the thread's own CPU time).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..otel import environment as env
from ..otel.health import Health
from ..otel.threads import daemon_thread

SAMPLER_THREAD = "cirron-metrics-sampler"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class GpuSample:
    id: str  # the GPU's UUID
    name: str
    utilization: float  # 0..1
    memory_used: int  # bytes
    memory_total: int


@dataclass(frozen=True)
class Sample:
    time_ns: int
    cpu_user: float  # seconds of CPU time of the process, since it started
    cpu_system: float
    cpu_utilization: float | None  # since the previous sample, over elapsed time and CPUs
    rss: int | None  # bytes
    gpus: tuple[GpuSample, ...] = ()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ProcessReader:
    """The process's CPU time and RSS, from the cheapest source the platform has.

    CPU time: ``os.times()`` (one system call, the figure psutil gives too). RSS: on
    Linux ``/proc/self/statm`` read from a descriptor kept open (a ``pread``), about ten
    times cheaper than psutil's open-read-close of ``/proc``; elsewhere psutil (the
    ``metrics`` extra), else ``getrusage``'s peak, the best the standard library offers.
    """

    def __init__(self) -> None:
        self._statm: int | None = None
        self._process: Any = None
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            self.source = "proc"
        except OSError:
            try:
                import psutil

                self._process = psutil.Process()
                self.source = "psutil"
            except Exception:  # noqa: BLE001 - ImportError, or psutil unusable here
                self.source = "getrusage"

    def cpu_times(self) -> tuple[float, float]:
        times = os.times()
        return times.user, times.system

    def rss(self) -> int | None:
        if self._statm is not None:
            try:
                return int(os.pread(self._statm, 64, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                self._statm = None
        if self._process is not None:
            return int(self._process.memory_info().rss)
        try:
            import resource
        except ImportError:
            return None
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the peak: the best there is
        return peak if sys.platform == "darwin" else peak * 1024

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


def _visible(count: int, uuids: list[str]) -> list[int]:
    """The indexes of the GPUs ``CUDA_VISIBLE_DEVICES`` names (by index or UUID), or all."""
    text = os.environ.get(env.CUDA_VISIBLE_DEVICES)
    if text is None:
        return list(range(count))
    chosen = []
    for item in (part.strip() for part in text.split(",")):
        if item.isdigit() and int(item) < count:
            chosen.append(int(item))
        elif item.startswith("GPU-"):
            chosen += [i for i, uuid in enumerate(uuids) if uuid.startswith(item)]
        else:
            break  # CUDA stops at the first entry it does not know (-1, a MIG id, a typo)
    return chosen


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuReader:
    """NVIDIA GPUs through NVML (``nvidia-ml-py``); :meth:`open` gives None without one."""

    def __init__(self, nvml: Any, handles: list[tuple[Any, str, str]]) -> None:
        self._nvml = nvml
        self.handles = handles  # (handle, uuid, name)

    @classmethod
    def open(cls) -> GpuReader | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, no driver: no GPU
            return None
        try:
            devices = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in devices]
            chosen = [
                (devices[i], uuids[i], _text(pynvml.nvmlDeviceGetName(devices[i])))
                for i in _visible(len(devices), uuids)
            ]
        except Exception:  # noqa: BLE001
            chosen = []
        if not chosen:
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, chosen)

    def read(self) -> tuple[GpuSample, ...]:
        nvml = self._nvml
        found = []
        for handle, uuid, name in self.handles:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            busy = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            found.append(GpuSample(uuid, name, busy / 100.0, int(memory.used), int(memory.total)))
        return tuple(found)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - closing a library that is going away
            pass


class SystemSampler:
    """The sampler thread: :meth:`start`, :attr:`latest`, :meth:`stop`."""

    def __init__(
        self,
        interval: float,
        on_sample: Callable[[Sample], None],
        health: Health,
        gpus: bool = True,
    ) -> None:
        """``gpus``: look for GPUs (NVML) when the thread starts."""
        self.interval = interval
        # Made on the sampler's thread: importing psutil and starting NVML take milliseconds.
        self.process: ProcessReader | None = None
        self.gpus: GpuReader | None = None
        self._look_for_gpus = gpus
        self.latest: Sample | None = None
        self.cpu_ns = 0  # the sampler thread's own CPU time, read by the thread after each sample
        self.samples = 0
        self._on_sample = on_sample
        self._health = health
        self._cpus = _cpus()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._thread = daemon_thread(self._run, SAMPLER_THREAD)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        """End the thread (waiting up to ``timeout``); :meth:`sample` still works after."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(max(0.0, timeout))

    def close(self) -> None:
        """Let go of NVML and the open file (after :meth:`stop`)."""
        if self._thread.is_alive():
            return
        if self.gpus is not None:
            self.gpus.close()
            self.gpus = None
        if self.process is not None:
            self.process.close()
            self.process = None

    def _run(self) -> None:
        if self._look_for_gpus:
            try:
                self.gpus = GpuReader.open()
            except Exception as error:  # noqa: BLE001 - no GPU figures, the rest goes on
                self._health.failed("opening NVML", error, "export_errors")
        while True:
            try:
                self.sample()
            except Exception as error:  # noqa: BLE001 - the sampler must not die of a reading
                self._health.failed("sampling system metrics", error, "export_errors")
            self.cpu_ns = time.thread_time_ns()
            if self._stop.wait(self.interval):  # stop() interrupts this wait
                return

    def sample(self) -> Sample:
        """Read everything once; the new :attr:`latest`."""
        if self.process is None:
            self.process = ProcessReader()
        now = time.time_ns()
        user, system = self.process.cpu_times()
        previous = self.latest
        utilization = None
        if previous is not None and now > previous.time_ns:
            used = (user + system) - (previous.cpu_user + previous.cpu_system)
            utilization = max(0.0, used / ((now - previous.time_ns) / 1e9) / self._cpus)
        gpus: tuple[GpuSample, ...] = ()
        if self.gpus is not None:
            try:
                gpus = self.gpus.read()
            except Exception as error:  # noqa: BLE001 - a GPU gone (or a driver reset)
                self._health.failed("reading the GPUs (NVML)", error, "export_errors")
                self.gpus = None
        sample = Sample(now, user, system, utilization, self.process.rss(), gpus)
        self.latest = sample
        self.samples += 1
        self._on_sample(sample)
        return sample
