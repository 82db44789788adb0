"""Which twins of the hottest hook entries run: the compiled ones, or the pure-Python ones.

Like ``wrapt``, cirron ships a small optional C extension, :mod:`cirron.recording._hot`,
built from the sdist wherever a C compiler is present (a Linux x86_64 wheel
carries it built). It holds only what runs for every module call of a model
(torch's ``nn.Module.__call__``), for every hook span of a step (their begin
and end), for the step cycle of a plain torch loop (the next batch's fetch, its
forward, backward and optimizer step: ``LoopHook`` and the module call, configured
by :mod:`cirron.instrumentors.torch`), and for the API's commonest calls:
``ci.scope`` and ``ci.mark``, the opening and closing of a step, an epoch or a
batch (``scopes.open_on`` and ``close_span``), ``ci.batches``' next item (one batch's
span ended and the next one's begun, with no Python frame), the span processor's ``on_start``/``on_end`` for cirron's
spans (whose ``on_end`` also takes an ended span out of the garbage collector's
sight: nothing it holds refers back to it), and the spool encoder's spans,
attributes and marks (``otlp_json.scope_span``, ``key_values`` and ``_events``).
Each handles the common case only and hands anything else to its pure-Python
twin (:func:`cirron.instrumentors.torch_modules.make_module_call`, the torch
hooks of :mod:`cirron.instrumentors.torch_steps`' moments, :mod:`cirron.recording.hook_spans`, :func:`cirron.instrumentors.torch_spans.open_hook`,
``PURE_TWINS`` in :mod:`cirron.recording.scopes` and in
:mod:`cirron.exporters.otlp_json`, ``PURE_MARK`` in :mod:`cirron.recording.marks`,
``PURE_NEXT`` in :mod:`cirron.training.loops`):
those are the reference and what every other platform gets; both give the same spans.

``CIRRON_PURE_PYTHON=1`` asks for the pure twin even where the extension is
built. ``ci.health()["hot_path"]`` says which one runs: ``compiled``, or
``python`` with the reason.
"""

from __future__ import annotations

import logging
import os
import time
import types
from typing import Any

from ..config import flag_text
from ..otel import environment as env

_log = logging.getLogger("cirron")


def _pure_asked() -> bool:
    text = os.environ.get(env.CIRRON_PURE_PYTHON, "")
    try:
        return bool(text.strip()) and flag_text(text)
    except ValueError as error:
        _log.warning("cirron: %s=%r: %s; ignored", env.CIRRON_PURE_PYTHON, text, error)
        return False


def _load() -> tuple[Any, str]:
    """The extension module (None for the pure twin), and what ``ci.health()`` says."""
    if _pure_asked():
        return None, f"python ({env.CIRRON_PURE_PYTHON}=1)"
    try:
        from . import _hot  # type: ignore[attr-defined]
    except ImportError:  # not built here (no compiler at install, another platform)
        return None, "python (the compiled helper is not built in this install)"
    return _hot, "compiled"


# Which hook of a plain torch loop's step cycle a compiled LoopHook is (its first argument).
FETCH_NEXT, BACKWARD, OPTIMIZER_PRE, OPTIMIZER_POST = range(4)
# A count that goes up whenever a module or class the compiled step cycle stands in for has an
# attribute set or deleted (a test's monkeypatch, a user's wrapper): the cycle then looks
# whether the Python functions it does the work of are still the ones it was given, and while
# one is not, the pure hooks run, the replacement with them. Mutated in place, never rebound.
patched = [0]


class _Counted:
    """Attributes set or deleted from outside count in :data:`patched`."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        patched[0] += 1

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        patched[0] += 1


class WatchedModule(_Counted, types.ModuleType):
    """A module whose attributes, set or deleted from outside, count in :data:`patched`
    (its own code's global assignments do not: they write its namespace directly)."""


class Watched(_Counted, type):
    """The metaclass of a class whose attributes, set or deleted, count in :data:`patched`."""


def watch(module: types.ModuleType) -> None:
    """Count what is set on ``module`` from now on in :data:`patched`."""
    if type(module) is types.ModuleType:
        module.__class__ = WatchedModule


compiled, hot_path = _load()
if compiled is not None:
    from ..exporters import otlp_json
    from ..otel.spans import SPAN_KEY, UNSET_STATUS, ScopeSpan, TracerState, context_variable
    from . import recorder, training_state

    # What every compiled twin reads (the hook spans, the scopes, the mark), given once: each
    # module that installs twins hands over only what is its own.
    compiled.configure(
        recorder=recorder,
        pending=training_state.pending_fetches,
        open=training_state.open_hook_spans,
        completed=training_state.completed,
        context_var=context_variable(),
        span_key=SPAN_KEY,
        scope_span=ScopeSpan,
        time_ns=time.time_ns,
        recorder_type=recorder.Recorder,
        unset_status=UNSET_STATUS,
        tracer_state=TracerState,
    )
    # The spool's encoder, in a package below this one, writes with it too.
    otlp_json.use_compiled(compiled)
