"""``ci.inference``: one span per call of a function that serves a model; what it returns.

Four ways in, one span each::

    @ci.inference                      # named "inference"
    def predict(batch): ...

    @ci.inference("classify", model=net)
    async def classify(images): ...

    traced = ci.inference(model.predict)

    with ci.inference("rerank") as call:
        call.record_input(candidates)
        scores = reranker(candidates)
        call.record_output(scores)

What a call's span holds: :mod:`cirron.inference.calls`; a generator's:
:mod:`cirron.inference.streams`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..otel import semconv, values
from ..recording.guard import report
from . import capture as content
from .calls import (
    NOTHING,
    SITE,
    Call,
    Spec,
    begin,
    describe,
    disabled,
    finish,
    for_function,
    make_spec,
    traced_coroutine,
    traced_function,
)
from .streams import traced_async_generator, traced_generator


def traced(function: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    """``function`` with one span per call (see the module docstring)."""
    spec = for_function(spec, function)
    if inspect.isasyncgenfunction(function):
        return traced_async_generator(function, spec)
    if inspect.isgeneratorfunction(function):
        return traced_generator(function, spec)
    if inspect.iscoroutinefunction(function):
        return traced_coroutine(function, spec)
    return traced_function(function, spec)


# -- the public object -----------------------------------------------------------------------------
class Inference:
    """What ``ci.inference(...)`` returns: a decorator, and a context manager.

    In a ``with`` block, :meth:`record_input` and :meth:`record_output` tell it
    what the block was given and produced (batch size, device, and what the
    capture policy keeps); :meth:`set_attribute` adds an attribute of your own.
    """

    __slots__ = ("_spec", "_call", "_result")

    def __init__(self, spec: Spec) -> None:
        self._spec = spec
        self._call: Call | None = None
        self._result: Any = NOTHING

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(function):
            raise TypeError(f"ci.inference decorates a function, got {type(function).__name__}")
        return traced(function, self._spec)

    def __enter__(self) -> Inference:
        self._result = NOTHING
        if disabled():
            return self
        try:
            self._call = begin(self._spec, (), {})
        except Exception as failure:  # noqa: BLE001 - the guard: the block runs untraced
            report(SITE, failure)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback: Any) -> None:
        call, self._call = self._call, None
        if call is not None:
            finish(call, exc, self._result)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the open span (ignored when not recording)."""
        value = values.attribute(value, f"inference {self._spec.name!r} attribute {key!r}")
        span = self._call.span if self._call is not None else None
        if span is not None:
            span.set_attribute(key, value)

    def record_input(self, value: Any) -> None:
        """What the block was given: its batch size and device, and what capture keeps."""
        call = self._call
        if call is None or call.span is None:
            return
        try:
            found: dict[str, Any] = {}
            describe(found, value, self._spec.model)
            call.span.set_attributes(found)
            call.attributes.update(found)
            if content.captures(call.capture):
                call.given = value
        except Exception as failure:  # noqa: BLE001 - the guard
            report(SITE, failure)

    def record_output(self, value: Any) -> None:
        """What the block produced (its device, and what capture keeps), recorded at its end."""
        self._result = value


def inference(name: Any = None, /, *, model: Any = None, **attributes: Any) -> Any:
    """Trace each call of a function that serves a model as one ``inference`` span.

    Use it as a decorator (``@ci.inference``, ``@ci.inference("generate")``),
    on a function you don't own (``ci.inference(pipe)``), or as a context
    manager (``with ci.inference("rerank") as call:``). Works on plain and
    ``async def`` functions, and on generators (plain or async: the span
    lasts until the stream is exhausted or closed).

    Each span has ``batch.size`` (the first argument's first dimension or
    length), ``device``, ``model.name`` and ``code.function.name`` when
    known, nests under the current span (a server span of FastAPI's or
    Flask's instrumentation), and records an exception with status ERROR.
    Prompt and completion text and tensor shapes are recorded only when
    ``ci.profile(capture=...)`` (or ``CIRRON_CAPTURE``, or
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``) asks for them,
    secrets redacted.

    Args:
        name: the span's name (default ``"inference"``), or the function to trace.
        model: the model served (its name and device are recorded), or its name.
        **attributes: attributes of your own, on every span.
    """
    if callable(name) and not isinstance(name, str):  # bare @ci.inference, or ci.inference(f)
        return Inference(make_spec(semconv.INFERENCE, model, attributes))(name)
    if name is None:
        name = semconv.INFERENCE
    values.name(name, "inference name")
    return Inference(make_spec(name, model, attributes))
