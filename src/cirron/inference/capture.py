"""What an inference span may record of a model's inputs and outputs, and in which form.

Nothing of the content is recorded unless asked for: prompt and completion
text and tensors are off by default. :func:`policy` says what the running
profiler was told (``ci.profile(capture={...})``, ``CIRRON_CAPTURE``, or
OpenTelemetry's ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``; see
:class:`cirron.config.Capture`). Each kind is on its own:

- ``text``: prompts and completions as OpenTelemetry GenAI messages, the
  JSON of ``gen_ai.input.messages`` / ``gen_ai.output.messages``
  (``[{"role": "user", "parts": [{"type": "text", "content": "..."}]}]``),
  as span attributes, as one ``gen_ai.client.inference.operation.details``
  event, or both (``where``); every text is redacted
  (:mod:`cirron.inference.redaction`) and cut to ``max_chars`` first.
- ``tensors``: the shapes of the input and the output (``input.shape``,
  ``output.shape``), never their values.

The helpers here also read what any call shows of its input without
recording content: a batch size, a device, a model's name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import Span

from .. import config
from ..config import Capture
from ..otel import semconv, values
from ..recording.recorder import Recorder
from .redaction import redact

# Fields and values of the GenAI messages' JSON (OpenTelemetry's input/output message schema).
_ROLE, _PARTS, _TYPE, _CONTENT, _FINISH = "role", "parts", "type", "content", "finish_reason"
_TEXT_PART = "text"
USER, ASSISTANT = "user", "assistant"
# Finish reasons, as the conventions name them: the model stopped on its own (an end-of-text
# token, a stop string), or ran into its token limit.
FINISH_STOP, FINISH_LENGTH = "stop", "length"
_SPAN_FORMS = ("span", "both")  # Capture.where values that write span attributes
_EVENT_FORMS = ("event", "both")  # ... and those that write the details event

Messages = list[tuple[str, str]]  # (role, text), in order

_from_environment: list[Any] = [None, None]  # (the settings it was read for, the Capture)
_device_names: dict[Any, str] = {}  # a torch device, by its name (str() costs more than a lookup)


def policy(rec: Recorder) -> Capture:
    """What ``rec``'s calls may capture: its profiler's setting, else what the environment
    says (a recorder made without ``ci.profile()``: plain OpenTelemetry, no profiler)."""
    capture = rec.settings.capture
    if capture is not None:
        return capture
    if _from_environment[0] is not rec.settings:
        _from_environment[1] = config.capture_from_environment()
        _from_environment[0] = rec.settings
    return _from_environment[1]  # type: ignore[no-any-return]


def captures(capture: Capture) -> bool:
    """Whether ``capture`` records anything of the content."""
    return capture.text or capture.tensors


# -- what a value shows without its content ---------------------------------------------------
def _first_shaped(value: Mapping[Any, Any]) -> Any:
    """The first value of a mapping (a tokenizer's ``BatchEncoding``) that has a shape."""
    for item in value.values():
        if getattr(item, "shape", None) is not None:
            return item
    return None


def shape_of(value: Any) -> list[int] | None:
    """The shape of a tensor or array (or of a mapping's first one); None when it has none."""
    if isinstance(value, Mapping):
        value = _first_shaped(value)
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, type):
        return None
    try:
        return [int(size) for size in shape]
    except (TypeError, ValueError):
        return None


def batch_size(value: Any) -> int | None:
    """How many inputs ``value`` holds: the first dimension of a tensor, array or frame, the
    length of a list; 1 for one text; None when it has neither a shape nor a length."""
    shape = getattr(value, "shape", None)  # first: a tensor, the common case, costs least
    if shape is None:
        if isinstance(value, (str, bytes)):
            return 1
        if isinstance(value, Mapping):
            shape = getattr(_first_shaped(value), "shape", None)
        elif isinstance(value, Sequence):
            return len(value)
    try:
        return int(shape[0]) if shape is not None and len(shape) else None
    except (TypeError, ValueError, IndexError):
        return None


def device_of(value: Any) -> str | None:
    """Where a tensor (or a mapping's first one, or a torch or HF model) lives: ``cpu``,
    ``cuda:0``; None when it says nothing of a device."""
    device = getattr(value, "device", None)
    if device is None:
        if isinstance(value, Mapping):
            device = getattr(_first_shaped(value), "device", None)
        elif callable(getattr(value, "parameters", None)):  # a torch module
            device = getattr(next(iter(value.parameters()), None), "device", None)
    if device is None or isinstance(device, str):  # an array API array's is a string
        return device
    name = _device_names.get(device)
    if name is None and getattr(device, "type", None) is not None:
        name = _device_names[device] = str(device)  # a process has few devices
    return name


def model_name(model: Any) -> str:
    """A model's name: what it was loaded from (an HF model's ``name_or_path``), else its
    class (``GPT2LMHeadModel``, ``LogisticRegression``); a string is taken as the name."""
    if isinstance(model, str):
        return model
    loaded_from = getattr(getattr(model, "config", None), "name_or_path", None)
    if isinstance(loaded_from, str) and loaded_from:
        return loaded_from
    return type(model).__name__


def is_model(value: Any) -> bool:
    """A torch module, a scikit-learn estimator, a Keras model or an HF model."""
    if value is None or isinstance(value, (str, bytes, type)):
        return False
    if hasattr(value, "parameters") and hasattr(value, "forward"):
        return True
    return hasattr(value, "predict") and (hasattr(value, "get_params") or hasattr(value, "layers"))


# -- text ----------------------------------------------------------------------------------------
def clean(text: str, capture: Capture) -> str:
    """``text`` as it may be recorded: secrets redacted, then cut to ``max_chars``."""
    return redact(text)[: capture.max_chars]


def input_messages(value: Any) -> Messages | None:
    """The prompt(s) in ``value``: a text, a list of texts, a chat (``[{"role": ...,
    "content": ...}]``) or a list of chats; None when it is none of these."""
    if isinstance(value, str):
        return [(USER, value)]
    if isinstance(value, Mapping):
        return _chat_message(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes) and value:
        found: Messages = []
        for item in value:
            messages = input_messages(item)
            if messages is None:
                return None
            found.extend(messages)
        return found
    return None


def _chat_message(message: Mapping[Any, Any]) -> Messages | None:
    role, content = message.get(_ROLE), message.get(_CONTENT)
    if isinstance(role, str) and isinstance(content, str):
        return [(role, content)]
    return None


def output_texts(value: Any) -> list[str] | None:
    """The completion(s) in ``value``: a text, a list of texts, or what an HF text-generation
    pipeline returns (``[{"generated_text": ...}]``, a chat's last message for a chat)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        generated = value.get("generated_text")
        if isinstance(generated, list) and generated:  # a chat: its new, last message
            last = _chat_message(generated[-1]) if isinstance(generated[-1], Mapping) else None
            return [last[0][1]] if last else None
        return [generated] if isinstance(generated, str) else None
    if isinstance(value, Sequence) and not isinstance(value, bytes) and value:
        found: list[str] = []
        for item in value:
            texts = output_texts(item)
            if texts is None:
                return None
            found.extend(texts)
        return found
    return None


def _message(role: str, text: str, finish_reason: str | None) -> dict[str, Any]:
    message: dict[str, Any] = {_ROLE: role, _PARTS: [{_TYPE: _TEXT_PART, _CONTENT: text}]}
    if finish_reason is not None:
        message[_FINISH] = finish_reason
    return message


def messages_json(
    messages: Messages, capture: Capture, finish_reasons: Sequence[str] | None = None
) -> str:
    """``messages`` as the JSON of GenAI messages, each text cleaned (:func:`clean`).

    Output messages carry their ``finish_reason`` (``finish_reasons[i]``, else
    ``stop``). The whole stays under the attribute length limit: texts are cut
    shorter rather than the JSON cut into something that no longer parses.
    """
    texts = [clean(text, capture) for _role, text in messages]
    limit = capture.max_chars
    while True:
        encoded = json.dumps(
            [
                _message(
                    role,
                    text[:limit],
                    None
                    if finish_reasons is None
                    else (finish_reasons[i] if i < len(finish_reasons) else FINISH_STOP),
                )
                for i, ((role, _), text) in enumerate(zip(messages, texts, strict=True))
            ],
            ensure_ascii=False,
        )
        if len(encoded) <= values.MAX_VALUE_LENGTH or limit == 0:
            return encoded
        limit //= 2


def record_messages(
    span: Span,
    capture: Capture,
    prompts: Messages | None,
    completions: list[str] | None,
    finish_reasons: Sequence[str] | None = None,
) -> None:
    """Record the prompts and completions on ``span`` in the form ``capture.where`` names."""
    found: dict[str, str] = {}
    if prompts:
        found[semconv.GEN_AI_INPUT_MESSAGES] = messages_json(prompts, capture)
    if completions:
        replies = [(ASSISTANT, text) for text in completions]
        found[semconv.GEN_AI_OUTPUT_MESSAGES] = messages_json(
            replies, capture, finish_reasons or ()
        )
    if not found:
        return
    if capture.where in _SPAN_FORMS:
        span.set_attributes(found)
    if capture.where in _EVENT_FORMS:
        span.add_event(semconv.GEN_AI_OPERATION_DETAILS, found)


def record_shapes(span: Span, given: Any, returned: Any) -> None:
    """``input.shape`` and ``output.shape`` of what a call was given and returned."""
    for key, value in ((semconv.INPUT_SHAPE, given), (semconv.OUTPUT_SHAPE, returned)):
        shape = shape_of(value)
        if shape is not None:
            span.set_attribute(key, shape)
