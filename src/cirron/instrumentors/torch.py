"""PyTorch instrumentation: training steps, epochs, forward, backward, optimizer and data spans.

Installed by ``ci.profile()`` once the script imports torch, or on its own
with plain OpenTelemetry::

    from cirron.instrumentors.torch import TorchInstrumentor
    TorchInstrumentor().instrument(tracer_provider=provider)

What becomes a span:

- ``forward``: one per call of an *outermost* module (attribute ``mode`` =
  ``train`` in train mode with gradients, else ``eval``; ``module`` = the
  class of the user's model, inside any DDP / ``torch.compile`` / FSDP /
  Fabric wrapper, whose class is ``wrapper``). Calls of its submodules are not
  spans and cost next to nothing. A block that activation checkpointing
  recomputes during ``backward`` is a ``forward`` with ``recompute`` true
  inside that backward, never a training forward of its own. A loss module called on its own
  (``nn.CrossEntropyLoss()(out, y)``) is not a span: its time is the gap
  between ``forward`` and ``backward`` in the step.
- ``backward``: ``loss.backward()`` and ``torch.autograd.backward(...)`` (one
  patch of the latter: ``Tensor.backward`` calls it).
- ``optimizer_step``: every ``optimizer.step()`` (global optimizer hooks); one
  that raises ends with the error. A ``GradScaler.step()`` that skipped the
  optimizer (inf/NaN gradients) is an ``optimizer_step`` with ``skipped``
  true, and its step says ``skipped`` and ``loss_scale``.
- ``data_load``: the wait inside a DataLoader iterator's ``__next__``, a
  child of the step its batch feeds (status ERROR when the fetch raised).
- ``collective``: each ``torch.distributed`` collective the program calls, and each
  gradient bucket DDP all-reduces inside ``backward`` (a child of that backward), until
  its work is done (:mod:`.torch_collectives`, :mod:`.torch_comm_hooks`).
- ``step``, ``epoch``, ``validate``/``evaluate``: found from these moments by
  :mod:`.torch_steps` and reported to :mod:`cirron.training`, which opens them
  unless a higher owner (``ci.epochs``/``ci.batches``, HF Trainer, Keras) has
  them.

The hooks live beside this module, one file per kind of work:
:mod:`.torch_modules` (forward, ``train()``, backward), :mod:`.torch_optim`
(optimizer steps, ``GradScaler``), :mod:`.torch_data` (DataLoader fetches),
:mod:`.torch_collectives` and :mod:`.torch_comm_hooks` (communication),
:mod:`.torch_spans` (the spans around a call, GPU time); what their moments
mean for the loop is :mod:`.torch_steps`.

Every hook runs through the core guard: a failure inside cirron is counted in
``ci.health()``, warned about once, and the training step runs on unchanged.
``uninstrument()`` restores every patched attribute and removes every hook.
"""

from __future__ import annotations

from typing import Any

from .. import training
from ..otel import semconv, values
from ..recording import hook_spans, hot, recorder, training_state
from ..recording.guard import guarded, report
from ..training import loop_frames, resources
from . import (
    FrameworkInstrumentor,
    torch_collectives,
    torch_comm_hooks,
    torch_data,
    torch_memory,
    torch_modules,
    torch_optim,
    torch_spans,
    torch_steps,
)
from .torch_spans import SITE, torch_module
from .torch_steps import LOOP, TORCH, TorchLoop

_settle = guarded(SITE)(lambda: LOOP.settle())


@guarded(SITE)
def _end_torch_moments() -> None:
    LOOP.record_held(None)  # forwards of a batch never judged: where the program is
    training.end_evaluation(TORCH)
    training.end_step(TORCH)
    training.end_epoch(TORCH)
    training.record_fetches(training.take_fetches())


# What the compiled step cycle does the work of: TorchLoop's methods, and the moments of
# cirron.training its hooks report.
_CYCLE_METHODS = (
    "fetch_begins",
    "fetch_ends",
    "training_work",
    "_begin_training_step",
    "backward_done",
    "optimizer_stepping",
    "optimizer_stepped",
    "_complete",
)
_CYCLE_MOMENTS = (
    "end_step",
    "fetch_begins_between_steps",
    "may_own",
    "take_fetches",
    "begin_step",
    "record_fetches",
    "complete_step",
)


def _compiled_step_cycle() -> None:
    """Hand the compiled step cycle (``LoopHook``, the compiled ``nn.Module.__call__``) what
    the hooks share: the next batch of a plain training loop, its forward, backward and
    optimizer step, with no Python frame; the Python hooks for every other moment."""
    hot.compiled.configure_loop(
        {
            "loop": LOOP,
            "torch": TORCH,
            "training": torch_steps.TRAINING,
            "exhausted": torch_steps.EXHAUSTED,
            "loader_pass": torch_steps.LoaderPass,
            "fetch": training_state.Fetch,
            "moment": training_state.Moment,
            "state": training_state.TrainingState,
            "outer_fetch": torch_data._outer_fetch,
            "pass_attribute": torch_data._PASS,
            "fetch_ends": torch_data._fetch_ends,
            "end_step": training.end_step,
            "record_on": hook_spans.record_on,
            "position": loop_frames.position,
            "users": torch_steps._NOT_THE_USERS,
            "last_positions": loop_frames._last,
            "enclosing": training_state.enclosing,
            "report": report,
            "site": SITE,
            "seen_models": torch_modules.seen_models,
            "backward_running": torch_modules.backward_running,
            "grad_enabled": torch_modules.grad_enabled,
            "buckets": torch_comm_hooks.buckets_recorded,
            "forward_failed": torch_modules.forward_failed,
            "backward_failed": torch_modules.close_backward,
            "optimizer_spans": torch_optim.optimizer_spans,
            "max_waiting": torch_steps.MAX_WAITING,
            # The Python functions whose work it does, as the pure hooks look them up: while
            # one is replaced (hot.patched counts), the pure hooks run.
            "patched": hot.patched,
            "watched": [
                *((TorchLoop, name) for name in _CYCLE_METHODS),
                *((training, name) for name in _CYCLE_MOMENTS),
                *((torch_modules, name) for name in ("_open_forward", "_open_backward")),
                (torch_modules, "_close_backward"),
                (torch_modules, "open_hook"),
                (torch_optim, "open_hook"),
                *((hook_spans, name) for name in ("begin", "end", "record_on")),
                (loop_frames, "position"),
            ],
            "names": {
                "step_name": semconv.STEP,
                "index_key": semconv.INDEX,
                "data_load_name": semconv.DATA_LOAD,
                "forward_name": semconv.FORWARD,
                "backward_name": semconv.BACKWARD,
                "optimizer_step_name": semconv.OPTIMIZER_STEP,
                "mode_key": semconv.MODE,
                "train_mode": semconv.MODE_TRAIN,
                "module_key": semconv.MODULE,
                "wrapper_key": semconv.WRAPPER,
                "optimizer_key": semconv.OPTIMIZER,
            },
        }
    )


if hot.compiled is not None:
    for _module in (training, torch_modules, torch_optim, hook_spans, loop_frames):
        hot.watch(_module)
    _compiled_step_cycle()


class TorchInstrumentor(FrameworkInstrumentor):
    """OpenTelemetry instrumentor for PyTorch training loops (see the module docstring)."""

    framework = "torch"
    _handles: list[Any] = []  # the optimizer hooks

    def install(self, module: str) -> None:
        LOOP.reset()
        torch = torch_module()
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        module_class, optimizer_class = torch.nn.Module, torch.optim.Optimizer
        scaler_class = torch.amp.GradScaler
        call, train = module_class.__dict__["__call__"], module_class.__dict__["train"]
        self.patch(module_class, "__call__", torch_modules.make_module_call(call))
        self.patch(module_class, "train", torch_modules.make_train(train))
        self.patch(torch.autograd, "backward", torch_modules.make_backward(torch.autograd.backward))
        self.patch(torch.autograd, "grad", torch_modules.make_grad(torch.autograd.grad))
        self.patch(
            _BaseDataLoaderIter, "__next__", torch_data.make_next(_BaseDataLoaderIter.__next__)
        )
        self.patch(_BaseDataLoaderIter, "_reset", torch_data.make_reset(_BaseDataLoaderIter._reset))
        loader_class = torch.utils.data.DataLoader
        loader_init = loader_class.__dict__["__init__"]
        self.patch(loader_class, "__init__", torch_data.make_loader_init(loader_init))
        initialize = optimizer_class.__dict__["__init__"]
        self.patch(optimizer_class, "__init__", torch_optim.make_optimizer_init(initialize))
        self.patch(
            scaler_class, "step", torch_optim.make_scaler_step(scaler_class.__dict__["step"])
        )
        before, after = torch_optim.step_hooks()
        self._handles.append(register_optimizer_step_pre_hook(before))
        self._handles.append(register_optimizer_step_post_hook(after))
        self._patch_distributed(torch)
        torch_spans.CUDA[0] = torch_memory.CUDA[0] = torch.cuda
        torch_memory.RAW_STATS[0] = getattr(torch._C, "_cuda_memoryStats", None)
        resources.add_device_probe(torch_memory.cuda_peaks, torch_memory.cuda_reset)
        torch_modules.grad_enabled[0] = torch.is_grad_enabled
        torch_modules.parameter_class[0] = torch.nn.Parameter
        LOOP.training_now = torch_data.training_now  # type: ignore[method-assign]
        training_state.hooks.settle_fetches = _settle
        values.device_reader[0] = torch_spans.device_value

    def _patch_distributed(self, torch: Any) -> None:
        """The collectives the program calls, and DDP's communication hook registration."""
        dist = torch.distributed
        if not dist.is_available():
            return
        for name in torch_collectives.OPS:
            original = dist.__dict__.get(name)
            if original is None:  # a collective this torch does not have
                continue
            self.patch(dist, name, torch_collectives.make_collective(original, name))
        ddp = torch.nn.parallel.DistributedDataParallel
        register = torch_comm_hooks.make_register_comm_hook(ddp.__dict__["register_comm_hook"])
        self.patch(ddp, "register_comm_hook", register)
        builtin = ddp.__dict__["_register_builtin_comm_hook"]
        self.patch(
            ddp,
            "_register_builtin_comm_hook",
            torch_comm_hooks.make_register_builtin_comm_hook(builtin),
        )

    def remove(self) -> None:
        torch_collectives.settle()  # a bucket's span that is still on its way lands first
        if recorder.current is not None:  # no hook will see another boundary: end ours
            _end_torch_moments()
        training_state.hooks.settle_fetches = training_state.nothing
        values.device_reader[0] = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        torch_optim.forget()
        torch_modules.forget()
        torch_data.forget()
        torch_collectives.forget()
        torch_spans.CUDA[0] = torch_memory.CUDA[0] = None
        resources.remove_device_probe(torch_memory.cuda_peaks)
