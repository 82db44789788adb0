"""One traced call: what is known of a function before it is called (:class:`Spec`), what a
call's input shows (batch size, device, model), and a call's span from its start to its end,
for plain and ``async def`` functions (generators: :mod:`cirron.inference.streams`).

The span is a child of whatever span is current (a web framework's server
span, a ``ci.scope``), else of ``cirron.session``, and it is the current span
while the function runs, so the model's own spans (the torch hooks'
``forward``, an LLM's ``generate``) nest under it. It records:
``batch.size`` (the first argument's first dimension, or its length),
``device`` (where that argument, else the model, lives), ``model.name``
(``model=``, or the ``self`` of a method that is a model or has a
``.model``), ``code.function.name``, and, when it raises, status ERROR with
the ``exception`` event and ``error.type``. What the capture policy allows of
the content is added (:mod:`cirron.inference.capture`; nothing by default).

Everything of cirron's runs behind the guard: a failure inside it is counted
in ``ci.health()`` and the call runs on, its result and its exceptions
unchanged. With profiling disabled the call is passed straight through; with
no profiler at all, spans are kept in memory for ``ci.trace()``, as
``ci.scope`` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from opentelemetry.trace import Span

from ..config import Capture
from ..otel import semconv, values
from ..recording import recorder
from ..recording.guard import report
from ..recording.scopes import Scope
from . import capture as content
from .genai import error_type

SITE = "ci.inference"  # how ci.health() names failures of cirron's own work here
NOTHING: Any = object()  # no result: the call raised, or a `with` block recorded none
_SELF = ("self", "cls")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Spec(NamedTuple):
    """What is known of a traced function before it is called."""

    name: str  # the span's name
    attributes: dict[str, Any]  # validated: the user's, the model's name, the function's
    model: Any = None  # the model given with model=, to read its device from (None: a name)
    takes_self: bool = False  # a method: its first argument is not the input
    first: str | None = None  # the parameter of the input, when passed by keyword


class Call(Scope):
    """One call's span (a :class:`Scope`), and what the capture policy keeps of its input."""

    __slots__ = ("capture", "given")
    capture: Capture
    given: Any


def make_spec(name: str, model: Any, attributes: dict[str, Any]) -> Spec:
    attributes = values.attributes(attributes, f"inference {name!r}") if attributes else {}
    if model is not None:
        attributes[semconv.MODEL_NAME] = content.model_name(model)
    return Spec(name, attributes, None if isinstance(model, str) else model)


def for_function(spec: Spec, function: Callable[..., Any]) -> Spec:
    """``spec`` with what the function's signature says of its input."""
    attributes = dict(spec.attributes)
    attributes[semconv.CODE_FUNCTION_NAME] = getattr(
        function, "__qualname__", type(function).__qualname__
    )
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin with no signature
        parameters = []
    takes_self = bool(parameters) and parameters[0].name in _SELF
    rest = parameters[1:] if takes_self else parameters
    first = rest[0].name if rest and rest[0].kind in _POSITIONAL else None
    return spec._replace(attributes=attributes, takes_self=takes_self, first=first)


# -- one call -------------------------------------------------------------------------------------
def input_of(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's input: its first argument (after ``self``), else that parameter by keyword."""
    position = 1 if spec.takes_self else 0
    if len(args) > position:
        return args[position]
    return kwargs.get(spec.first) if spec.first is not None else None


def _model_of(owner: Any) -> Any:
    """The model a method serves: its ``self`` if that is a model, else ``self.model``."""
    if content.is_model(owner):
        return owner
    model = getattr(owner, "model", None)
    return model if content.is_model(model) else None


def start_attributes(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The span's attributes at its start: the spec's, then what the input shows."""
    attributes = dict(spec.attributes)
    given = input_of(spec, args, kwargs)
    model = spec.model
    if model is None and spec.takes_self and args:
        model = _model_of(args[0])
        if model is not None:
            attributes[semconv.MODEL_NAME] = content.model_name(model)
    if given is not None or model is not None:
        describe(attributes, given, model)
    return attributes


def describe(attributes: dict[str, Any], given: Any, model: Any = None) -> None:
    """Add ``batch.size`` and ``device`` from the input ``given`` (the device: else ``model``'s)."""
    if given is not None:
        size = content.batch_size(given)
        if size is not None:
            attributes[semconv.BATCH_SIZE] = size
    device = content.device_of(given) if given is not None else None
    if device is None and model is not None:
        device = content.device_of(model)
    if device is not None:
        attributes[semconv.DEVICE] = device


def begin(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """Open the call's span, current from now on."""
    rec = recorder.current or recorder.active()
    call = Call(spec.name, start_attributes(spec, args, kwargs))
    capture = rec.settings.capture
    call.capture = capture = content.policy(rec) if capture is None else capture
    call.given = input_of(spec, args, kwargs) if capture.text or capture.tensors else None
    call.__enter__()
    return call


def _end(call: Call, error: BaseException | None, result: Any) -> None:
    """What the result shows, then the span ends (with ``error`` recorded, if any)."""
    try:
        span = call.span
        if span is not None:
            if (
                result is not None
                and result is not NOTHING
                and semconv.DEVICE not in call.attributes
            ):
                device = content.device_of(result)
                if device is not None:
                    span.set_attribute(semconv.DEVICE, device)
            capture = call.capture
            if capture.text or capture.tensors:
                record_content(span, capture, call.given, result)
            if error is not None:
                span.set_attribute(semconv.ERROR_TYPE, error_type(error))
    finally:
        call.__exit__(None if error is None else type(error), error, None)


def record_content(span: Span, capture: Capture, given: Any, result: Any) -> None:
    returned = None if result is NOTHING else result
    if capture.tensors:
        content.record_shapes(span, given, returned)
    if capture.text:
        prompts = content.input_messages(given) if given is not None else None
        completions = content.output_texts(returned) if returned is not None else None
        content.record_messages(span, capture, prompts, completions)


def finish(call: Call, error: BaseException | None, result: Any) -> None:
    try:
        _end(call, error, result)
    except Exception as failure:  # noqa: BLE001 - the guard: the call's outcome stands
        report(SITE, failure)


def disabled() -> bool:
    rec = recorder.current
    return rec is not None and not rec.enabled


# -- plain and async functions -----------------------------------------------------------------------
def traced_function(function: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        rec = recorder.current
        if rec is not None and not rec.enabled:  # (inline: this is the hot path)
            return function(*args, **kwargs)
        try:
            call = begin(spec, args, kwargs)
        except Exception as failure:  # noqa: BLE001 - the guard: the call runs untraced
            report(SITE, failure)
            return function(*args, **kwargs)
        try:
            result = function(*args, **kwargs)
        except BaseException as error:
            finish(call, error, NOTHING)
            raise
        finish(call, None, result)
        return result

    return run


def traced_coroutine(function: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(function)
    async def run(*args: Any, **kwargs: Any) -> Any:
        if disabled():
            return await function(*args, **kwargs)
        try:
            call = begin(spec, args, kwargs)
        except Exception as failure:  # noqa: BLE001 - the guard: the call runs untraced
            report(SITE, failure)
            return await function(*args, **kwargs)
        try:
            result = await function(*args, **kwargs)
        except BaseException as error:
            finish(call, error, NOTHING)
            raise
        finish(call, None, result)
        return result

    return run
