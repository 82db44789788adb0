"""An LLM call as OpenTelemetry's GenAI semantic conventions describe it, for any framework.

A framework's instrumentor (:mod:`cirron.instrumentors.transformers_generate`)
translates its own call into a :class:`Generation`: what was asked
(:func:`request_attributes`: ``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.request.max_tokens``, temperature, top-p,
...), then what came back (token counts, finish reasons, the time of the first
token). :meth:`Generation.finish` writes the response attributes on the
call's span, and the prompt and completion text when the capture policy asks
for them (:mod:`cirron.inference.capture`). The span's name is
``"{operation} {model}"``, as the conventions name it (:func:`span_name`).

Backends that understand the conventions show such a span as an LLM call
with its token counts (Arize Phoenix does; so does the OpenTelemetry
Collector's GenAI processing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from ..config import Capture
from ..otel import semconv
from ..otel.spans import ScopeSpan
from . import capture as content

TEXT_COMPLETION = semconv.GenAiOperationNameValues.TEXT_COMPLETION.value
CHAT = semconv.GenAiOperationNameValues.CHAT.value
STOP, LENGTH = content.FINISH_STOP, content.FINISH_LENGTH  # finish reasons


def span_name(operation: str, model: str) -> str:
    """``"{gen_ai.operation.name} {gen_ai.request.model}"``, the conventions' span name."""
    return f"{operation} {model}" if model else operation


def request_attributes(
    operation: str, provider: str, model: str, parameters: dict[str, Any]
) -> dict[str, Any]:
    """The request's attributes; ``parameters`` by GenAI name (``semconv.GEN_AI_REQUEST_*``),
    those that are None left out."""
    attributes: dict[str, Any] = {
        semconv.GEN_AI_OPERATION_NAME: operation,
        semconv.GEN_AI_PROVIDER_NAME: provider,
    }
    if model:
        attributes[semconv.GEN_AI_REQUEST_MODEL] = model
    attributes.update((key, value) for key, value in parameters.items() if value is not None)
    return attributes


@dataclass(slots=True)
class Generation:
    """What one LLM call has shown so far; summed over the generations it made (a pipeline
    call generates once per batch of its inputs)."""

    span: Span
    capture: Capture
    started_ns: int = field(default_factory=time.time_ns)
    generations: int = 0  # model.generate() calls made for it
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    first_token_ns: int | None = None  # the first new token a streamer was handed
    prompts: content.Messages | None = None  # captured text, when the policy says so
    completions: list[str] | None = None

    def first_token(self) -> None:
        """A streamer got the call's first new token now."""
        if self.first_token_ns is None:
            self.first_token_ns = time.time_ns()

    def counted(self, input_tokens: int, output_tokens: int, reasons: list[str]) -> None:
        """One generation's token counts and its sequences' finish reasons."""
        self.generations += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.finish_reasons.extend(reasons)

    def finish(self, error: BaseException | None = None) -> None:
        """Write what came back on the span (which the caller then ends)."""
        span = self.span
        found: dict[str, Any] = {}
        if self.generations:
            found[semconv.GEN_AI_USAGE_INPUT_TOKENS] = self.input_tokens
            found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = self.output_tokens
            found[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(self.finish_reasons)
            seconds = (time.time_ns() - self.started_ns) / 1e9
            if seconds > 0:
                found[semconv.TOKENS_PER_SECOND] = self.output_tokens / seconds
        if self.first_token_ns is not None:
            first = (self.first_token_ns - self.started_ns) / 1e9
            found[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = first
        if error is not None:
            found[semconv.ERROR_TYPE] = error_type(error)
        set_valid(span, found)
        if self.capture.text:
            content.record_messages(
                span, self.capture, self.prompts, self.completions, self.finish_reasons
            )


def set_valid(span: Span, found: dict[str, Any]) -> None:
    """Set attributes whose values are valid OpenTelemetry values already (ints, floats, strs,
    tuples of one of them): on cirron's own spans without validating each again."""
    if type(span) is ScopeSpan:
        for key, value in found.items():
            span.set_mark_attribute(key, value)
    else:
        span.set_attributes(found)


def error_type(error: BaseException) -> str:
    """``error.type``: the exception's fully qualified class name (builtins by its name)."""
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module in ("builtins", "") else f"{module}.{kind.__qualname__}"
