"""Snapshots of torch models: the ``nn.Module`` adapter behind :mod:`cirron.snapshots.capture`.

What the training thread does at a boundary, and nothing more:

- **CPU tensors** are copied as they are (same dtype) into one staging buffer
  per dtype, reused from boundary to boundary: one pass over the bytes. The
  buffers are allocated and touched on the snapshot thread when the model is
  watched, so even the first boundary doesn't pay for fresh memory.
- **Tensors on an accelerator** are summarised where they are: the reductions
  are enqueued on the device's current stream (so they see the values before
  the next step's kernels change them) and only the small summaries, plus the
  raw tensors of a sampled boundary (into pinned host memory), are copied to
  the host, without waiting. An event tells the snapshot thread when they
  have arrived.

On the snapshot thread: the CPU summaries, a few passes per tensor in float32
(float64 for float64 and integer tensors): min and max, sum, histogram, then
the centred squares; a slower masked pass only for a tensor that holds NaN or
inf. Then the safetensors files, which ``safetensors`` writes straight from
the staging buffers.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import sys
import threading
import weakref
from typing import Any

from ..otel import semconv
from ..otel.threads import daemon_thread
from ..snapshots.records import HISTOGRAM_BINS, TensorRecord, empty_summary
from .torch_modules import unwrap

_KEEP_FREE = 2  # staging buffers kept per model and dtype
_CHUNK_BYTES = 4 << 20  # the staging copy's unit of work


def _torch() -> Any:
    return sys.modules["torch"]


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# -- statistics ------------------------------------------------------------------------
def _computable(x: Any) -> Any:
    """``x`` flat, in a dtype the reductions run in: float32 or float64 (a copy if converted)."""
    torch = _torch()
    x = x.reshape(-1)
    if x.is_complex():
        x = torch.view_as_real(x).reshape(-1)  # stats over the components
    if x.dtype in (torch.float32, torch.float64):
        return x
    if x.is_floating_point():
        return x.float()  # float16, bfloat16, float8
    return x.double()  # integers and bool: exact in float64


def summarise_copy(tensor: Any) -> list[float]:
    """The summary of a CPU tensor this module owns (it is overwritten)."""
    x = _computable(tensor)
    if x.numel() == 0:
        return empty_summary()
    low, high = (value.item() for value in _torch().aminmax(x))
    if math.isfinite(low) and math.isfinite(high):  # NaN would have propagated here
        return _finite_summary(x, low, high, 0, 0)
    return _masked_summary(x)


def _finite_summary(x: Any, low: float, high: float, nan: int, inf: int) -> list[float]:
    torch = _torch()
    count = x.numel()
    mean = x.sum().item() / count
    if high > low:
        histogram = torch.histc(x, HISTOGRAM_BINS, low, high).tolist()
    else:
        histogram = [count] + [0] * (HISTOGRAM_BINS - 1)
    m2 = x.sub_(mean).square_().sum().item()  # centred: no cancellation when |mean| >> std
    return [count, nan, inf, mean, m2, low, high, *histogram]


def _masked_summary(x: Any) -> list[float]:
    torch = _torch()
    nan = int(torch.isnan(x).sum().item())
    finite = x[torch.isfinite(x)]
    inf = x.numel() - finite.numel() - nan
    if finite.numel() == 0:
        return empty_summary(nan, inf)
    low, high = (value.item() for value in torch.aminmax(finite))
    return _finite_summary(finite, low, high, nan, inf)


def device_summary(tensor: Any) -> Any:
    """The summary as a float64 tensor on ``tensor``'s device, without waiting for it.

    Every step is a tensor operation (no ``.item()``), so on a GPU this only
    enqueues kernels; non-finite values are masked out unconditionally,
    since nothing may be read back to decide.
    """
    torch = _torch()
    x = _computable(tensor)
    if x.numel() == 0:
        return torch.tensor(empty_summary(), dtype=torch.float64, device=x.device)
    finite = torch.isfinite(x)
    count = finite.sum()
    nan = torch.isnan(x).sum()
    mean = torch.where(finite, x, 0).sum() / count
    m2 = torch.where(finite, x - mean, 0).square_().sum()
    low = torch.where(finite, x, math.inf).amin()
    high = torch.where(finite, x, -math.inf).amax()
    width = torch.where(high > low, high - low, 1)
    # Finite values map into [0, 1]; NaN and inf land outside and histc ignores them.
    histogram = torch.histc((x - low) / width, HISTOGRAM_BINS, 0, 1)
    scalars = torch.stack([count.to(x.dtype), nan.to(x.dtype), mean, m2, low, high])
    inf = x.numel() - scalars[0:1] - scalars[1:2]
    return torch.cat([scalars[:2], inf, scalars[2:], histogram.to(x.dtype)]).double()


# -- staging buffers ---------------------------------------------------------------------
class _Staging:
    """Reusable CPU buffers of one model, per dtype (taken on one thread, given back on another)."""

    def __init__(self) -> None:
        self._free: dict[Any, list[Any]] = {}
        self._lock = threading.Lock()

    def take(self, dtype: Any, numel: int) -> Any:
        with self._lock:
            free = self._free.get(dtype, [])
            fitting = [i for i, buffer in enumerate(free) if buffer.numel() >= numel]
            if fitting:  # the smallest that fits (a list of tensors: by position, not ==)
                return free.pop(min(fitting, key=lambda i: free[i].numel()))
        return _torch().empty(numel, dtype=dtype)

    def give_back(self, buffer: Any) -> None:
        with self._lock:
            free = self._free.setdefault(buffer.dtype, [])
            free.append(buffer)
            free.sort(key=lambda b: -b.numel())
            del free[_KEEP_FREE:]

    def has(self, dtype: Any, numel: int) -> bool:
        with self._lock:
            return any(b.numel() >= numel for b in self._free.get(dtype, []))


_staging: weakref.WeakKeyDictionary[Any, _Staging] = weakref.WeakKeyDictionary()
_staging_lock = threading.Lock()


def _staging_of(model: Any) -> _Staging:
    with _staging_lock:
        staging = _staging.get(model)
        if staging is None:
            staging = _staging[model] = _Staging()
        return staging


# -- the capture ---------------------------------------------------------------------------
def _tensors(model: Any) -> list[tuple[str, str, Any, bool]]:
    """(parameter name, weight/gradient, tensor, trainable) in ``named_parameters()`` order."""
    found = []
    for name, parameter in model.named_parameters():
        found.append((name, semconv.KIND_WEIGHT, parameter.detach(), parameter.requires_grad))
        if parameter.grad is not None:
            found.append((name, semconv.KIND_GRADIENT, parameter.grad.detach(), True))
    return found


def _local(tensor: Any) -> Any:
    """A dense tensor holding the values (sparse made dense, a DTensor's local shard)."""
    if hasattr(tensor, "to_local"):
        tensor = tensor.to_local()
    if tensor.layout != _torch().strided:
        tensor = tensor.to_dense()
    return tensor


def _plain_cpu(tensor: Any) -> bool:
    """A tensor whose values are exactly its contiguous bytes in host memory."""
    torch = _torch()
    return (
        type(tensor) is torch.Tensor
        and tensor.device.type == "cpu"
        and tensor.is_contiguous()
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


def _copy_bytes(ranges: list[tuple[int, int, int]]) -> None:
    """``memmove`` each (destination, source, size), shared by this thread and a helper.

    Not torch's copy: it splits every tensor over its intra-op threads, and on a
    busy machine each split waits for its slowest thread to be scheduled (a
    boundary of a hundred tensors took 5-10 times longer while another process
    ran). Here the two threads take chunks from one queue until it is empty, so
    this thread waits at most for the one chunk the helper is copying.
    """
    chunks = [
        (destination + at, source + at, min(_CHUNK_BYTES, size - at))
        for destination, source, size in ranges
        for at in range(0, size, _CHUNK_BYTES)
    ]
    taken = itertools.count()
    finished: list[int] = []
    all_done = threading.Event()

    def copy_chunks() -> None:
        for index in taken:
            if index >= len(chunks):
                return
            ctypes.memmove(*chunks[index])  # releases the GIL
            finished.append(index)
            if len(finished) == len(chunks):
                all_done.set()

    if len(chunks) >= 4:
        try:
            daemon_thread(copy_chunks, "cirron-snapshot-copy").start()
        except RuntimeError:  # interpreter shutting down: no new threads
            pass
    copy_chunks()
    if chunks:
        all_done.wait()


class TorchCapture:
    """The tensors of one model at one boundary; see the module docstring."""

    def __init__(self, model: Any, raw: bool) -> None:
        torch = _torch()
        tensors = _tensors(model)
        self.tensor_count = len(tensors)
        self._meta = [
            (
                name,
                kind,
                dtype_name(t.dtype),
                tuple(t.shape),
                trainable if kind == semconv.KIND_WEIGHT else None,
            )
            for name, kind, t, trainable in tensors
        ]
        # per tensor: ("host", copy) | ("device", (host summaries, row)) | ("none", None)
        self._sources: list[tuple[str, Any]] = []
        self._raw: dict[int, Any] = {}  # tensor position -> host copy to save
        self._staged: list[Any] = []
        self._staging = _staging_of(model)
        self._events: list[Any] = []
        with torch.no_grad():
            local = [_local(t) for _, _, t, _ in tensors]
            self._copy_host(local)
            self._launch_device(local, raw)

    def _copy_host(self, tensors: list[Any]) -> None:
        """Copy every CPU tensor into its dtype's staging buffer."""
        sources: list[tuple[str, Any]] = [("none", None)] * len(tensors)
        by_dtype: dict[Any, list[int]] = {}
        for position, tensor in enumerate(tensors):
            if tensor.device.type == "cpu":
                by_dtype.setdefault(tensor.dtype, []).append(position)
        ranges = []
        for dtype, positions in by_dtype.items():
            buffer = self._staging.take(dtype, sum(tensors[p].numel() for p in positions))
            self._staged.append(buffer)
            offset = 0
            for position in positions:
                tensor = tensors[position]
                copy = buffer[offset : offset + tensor.numel()].view(tensor.shape)
                if _plain_cpu(tensor):
                    nbytes = tensor.numel() * tensor.element_size()
                    ranges.append((copy.data_ptr(), tensor.data_ptr(), nbytes))
                else:
                    copy.copy_(tensor)
                offset += tensor.numel()
                sources[position] = ("host", copy)
                self._raw[position] = copy
        _copy_bytes(ranges)
        self._sources = sources

    def _launch_device(self, tensors: list[Any], raw: bool) -> None:
        """Enqueue the summaries (and raw copies) of accelerator tensors on their streams."""
        torch = _torch()
        by_device: dict[Any, list[tuple[int, Any]]] = {}
        for position, tensor in enumerate(tensors):
            if tensor.device.type in ("cpu", "meta"):
                continue
            by_device.setdefault(tensor.device, []).append((position, device_summary(tensor)))
            if raw:
                self._raw[position] = _to_host(tensor)
        for device, rows in by_device.items():
            summaries = _to_host(torch.stack([summary for _, summary in rows]))
            for row, (position, _) in enumerate(rows):
                self._sources[position] = ("device", (summaries, row))
            if device.type == "cuda":
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                self._events.append(event)

    def _wait(self) -> None:
        for event in self._events:
            event.synchronize()

    # -- on the snapshot thread ----------------------------------------------------------
    def save(self, kind: str, path: str, metadata: dict[str, str]) -> bool:
        tensors = {
            self._meta[p][0]: copy
            for p, copy in sorted(self._raw.items())
            if self._meta[p][1] == kind
        }
        if not tensors:
            return False
        self._wait()
        from safetensors.torch import save_file  # only ever needed for raw tensors

        save_file(tensors, path, metadata=metadata)
        return True

    def records(self) -> list[TensorRecord]:
        self._wait()
        records: list[TensorRecord] = []
        for (name, kind, dtype, shape, trainable), (where, source) in zip(
            self._meta, self._sources, strict=True
        ):
            if where == "host":
                summary = summarise_copy(source)
            elif where == "device":
                summaries, row = source
                summary = summaries[row].tolist()
            else:  # meta: no values to describe
                summary = empty_summary()
            records.append(TensorRecord(name, kind, dtype, shape, summary, trainable))
        return records

    def release(self) -> None:
        staged, self._staged = self._staged, []
        self._sources, self._raw = [], {}
        for buffer in staged:
            self._staging.give_back(buffer)


def _to_host(tensor: Any) -> Any:
    """A host copy of a device tensor: on CUDA into pinned memory, enqueued, not waited for
    (another accelerator: a plain copy, which waits)."""
    if tensor.device.type != "cuda":
        return tensor.cpu()
    host = _torch().empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class TorchSnapshots:
    """The adapter: which models it takes, how it captures them, how it gets ready."""

    def claims(self, model: Any) -> bool:
        return isinstance(model, _torch().nn.Module)

    def unwrap(self, model: Any) -> Any:
        return unwrap(model)

    def capture(self, model: Any, raw: bool) -> TorchCapture:
        return TorchCapture(model, raw)

    def prepare(self, model: Any, raw: bool) -> None:
        """Allocate and touch the staging buffers the first boundary will need.

        With ``raw`` also import ``safetensors`` now: an import holds the GIL for
        long, and the training thread would wait on it at a boundary.
        """
        if raw:
            try:
                import safetensors.torch  # noqa: F401
            except ImportError:
                pass  # reported when a file is written
        needed: dict[Any, int] = {}
        for parameter in model.parameters():
            if parameter.device.type == "cpu" and parameter.layout == _torch().strided:
                copies = 2 if parameter.requires_grad else 1  # weight, and its gradient
                needed[parameter.dtype] = (
                    needed.get(parameter.dtype, 0) + copies * parameter.numel()
                )
        staging = _staging_of(model)
        for dtype, numel in needed.items():
            if not staging.has(dtype, numel):
                buffer = _torch().empty(numel, dtype=dtype)
                buffer.zero_()  # fault the pages in here, not on the training thread
                staging.give_back(buffer)


ADAPTER = TorchSnapshots()
