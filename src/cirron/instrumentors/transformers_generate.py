"""LLM generation with transformers, traced with OpenTelemetry's GenAI conventions, no code change.

Installed with the Trainer's hooks (:mod:`.transformers`) once the script
imports transformers. What becomes a span:

- ``model.generate(...)`` (``GenerationMixin.generate``: every HF model): one
  span, named ``text_completion {model}`` as the GenAI conventions name it.
- a text-generation ``pipeline(...)`` call on a text, a list of texts, a chat
  or a list of chats: one span, ``text_completion {model}`` or ``chat {model}``.
  The ``generate`` calls it makes (one per batch of its inputs) are part of it,
  not spans of their own: their token counts add up on it. A pipeline fed a
  generator or a dataset returns an iterator that generates later: its
  ``generate`` calls are spans of their own.

Attributes: ``gen_ai.operation.name``, ``gen_ai.provider.name``
(``huggingface``), ``gen_ai.request.model`` (what the model was loaded from,
else its class), ``gen_ai.request.max_tokens``, and when sampling
``gen_ai.request.temperature``, ``gen_ai.request.top_p``, ``gen_ai.request.top_k``;
``gen_ai.request.choice.count``, ``gen_ai.request.stop_sequences`` and
``gen_ai.request.stream`` when they apply; ``gen_ai.usage.input_tokens`` (the
prompt's tokens, padding left out by the attention mask),
``gen_ai.usage.output_tokens`` (each sequence's new tokens, up to and with its
end-of-text token), ``gen_ai.response.finish_reasons`` (``stop`` or
``length``, per sequence), ``tokens_per_second`` (output tokens over the
call's time), ``batch.size``, ``device``; with a streamer,
``gen_ai.response.time_to_first_chunk`` (seconds to the first new token). A
call that raises has status ERROR, the ``exception`` event and ``error.type``.

Each call is a pass of the transformers owner (:func:`cirron.training.begin_pass`),
and the current span while it runs: the torch hooks record the model's
forwards inside it, as its children, and open no ``evaluate`` pass of their
own around them (which they would in a loop over a DataLoader of prompts). A
training step whose work is done ends first, as it does before evaluation.

Prompt and completion text is recorded only when the capture policy says so
(:mod:`cirron.inference.capture`): a pipeline's texts, or a ``generate`` call's
decoded with the ``tokenizer=`` it was given (or its streamer's tokenizer).
Everything of cirron's runs behind the guard; ``uninstrument()`` puts
``generate`` and the pipeline's ``__call__`` back.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from .. import training
from ..inference import capture as content
from ..inference.calls import describe
from ..inference.genai import (
    CHAT,
    LENGTH,
    STOP,
    TEXT_COMPLETION,
    Generation,
    request_attributes,
    span_name,
)
from ..otel import semconv
from ..recording import recorder
from ..recording.guard import guarded
from ..recording.training_state import Moment
from . import FrameworkInstrumentor

_SITE = "transformers generate hook"
HF = training.owner("transformers")
TORCH = training.owner("torch")
PROVIDER = "huggingface"  # gen_ai.provider.name: a model run by transformers, in this process


@dataclass(slots=True)
class Running:
    """The LLM call open in this context: its span's pass, and what it has shown so far."""

    generation: Generation
    moment: Moment
    pipeline: bool  # a pipeline call: the generate calls inside are part of it


# A generate inside a pipeline call adds to it; one inside a generate (assisted decoding's
# assistant model) is part of that generate's work.
_running: ContextVar[Running | None] = ContextVar("cirron_llm_call", default=None)
# Per model: its name and whether it is an encoder-decoder (an HF model's attributes cost
# microseconds each to read; a call of a tiny model is a few milliseconds).
_models: weakref.WeakKeyDictionary[Any, tuple[str, bool]] = weakref.WeakKeyDictionary()


def install(instrumentor: FrameworkInstrumentor) -> None:
    """Patch ``GenerationMixin.generate`` and the text-generation pipeline's ``__call__``."""
    from transformers.generation.utils import GenerationMixin
    from transformers.pipelines.text_generation import TextGenerationPipeline

    generate = GenerationMixin.__dict__["generate"]
    instrumentor.patch(GenerationMixin, "generate", _traced_generate(generate))
    if "__call__" in TextGenerationPipeline.__dict__:
        call = TextGenerationPipeline.__dict__["__call__"]
        instrumentor.patch(TextGenerationPipeline, "__call__", _traced_pipeline(call))


def _model_facts(model: Any) -> tuple[str, bool]:
    """``model``'s name, and whether it is an encoder-decoder: read once per model."""
    facts = _models.get(model)
    if facts is None:
        config = getattr(model, "config", None)
        facts = (content.model_name(model), bool(getattr(config, "is_encoder_decoder", False)))
        _models[model] = facts
    return facts


def _open(operation: str, name: str, attributes: dict[str, Any]) -> Running | None:
    """Begin an LLM call's pass (its span current from now on); None when not recording."""
    rec = recorder.current
    if rec is None or not rec.enabled:
        return None
    capture = content.policy(rec)
    attributes.update(request_attributes(operation, PROVIDER, name, {}))
    training.end_completed_step(TORCH)  # as evaluation does: not inside a step that is done
    moment = training.begin_pass(HF, span_name(operation, name), attributes)
    if moment is None:
        return None
    return Running(Generation(moment.opened[0], capture), moment, pipeline=False)


def _close(running: Running, error: BaseException | None) -> None:
    """Write what came back, and end the call's pass."""
    try:
        running.generation.finish(error)
    finally:
        running.moment.batches = running.generation.generations
        training.end_pass(HF, running.moment, error)


# -- model.generate() -----------------------------------------------------------------------------
class TimedStreamer:
    """The user's streamer, handed to ``generate`` in its place: notes the first new token.

    ``generate`` hands a streamer the prompt first, then the new tokens; the
    second ``put`` is the first token. Everything else is the user's streamer's.
    """

    def __init__(self, streamer: Any, generation: Generation) -> None:
        self._streamer = streamer
        self._generation = generation
        self._puts = 0

    def put(self, value: Any) -> Any:
        self._puts += 1
        if self._puts == 2:
            self._generation.first_token()
        return self._streamer.put(value)

    def end(self) -> Any:
        return self._streamer.end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._streamer, name)


@dataclass(slots=True)
class Generate:
    """One ``generate`` call: its inputs, for counting its tokens once it returned."""

    running: Running
    own: bool  # a span of its own (else part of a pipeline call's)
    prompt: Any  # the input ids, or None
    mask: Any  # the attention mask, or None
    embeds: Any  # inputs_embeds, when no ids were given
    eos: list[int]  # end-of-text token ids
    max_new: int | None  # the new tokens it may make
    encoder_decoder: bool
    tokenizer: Any  # to decode the text, when capture keeps it


def _setting(config: Any, kwargs: dict[str, Any], name: str) -> Any:
    """A generation setting: the call's keyword, else its generation config's."""
    return kwargs[name] if name in kwargs else getattr(config, name, None)


def _token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _parameters(config: Any, kwargs: dict[str, Any], max_new: int | None) -> dict[str, Any]:
    """The request's parameters by GenAI name (temperature, top-p, top-k only when sampling)."""
    found: dict[str, Any] = {
        semconv.GEN_AI_REQUEST_MAX_TOKENS: max_new,
        semconv.GEN_AI_REQUEST_STREAM: True if kwargs.get("streamer") is not None else None,
    }
    if _setting(config, kwargs, "do_sample"):
        for key, name, kind in (
            (semconv.GEN_AI_REQUEST_TEMPERATURE, "temperature", float),
            (semconv.GEN_AI_REQUEST_TOP_P, "top_p", float),
            (semconv.GEN_AI_REQUEST_TOP_K, "top_k", int),
        ):
            value = _setting(config, kwargs, name)
            found[key] = kind(value) if value is not None else None
    choices = _setting(config, kwargs, "num_return_sequences")
    if isinstance(choices, int) and choices > 1:
        found[semconv.GEN_AI_REQUEST_CHOICE_COUNT] = choices
    stops = _setting(config, kwargs, "stop_strings")
    if stops:
        found[semconv.GEN_AI_REQUEST_STOP_SEQUENCES] = (
            (stops,) if isinstance(stops, str) else tuple(str(s) for s in stops)
        )
    return {key: value for key, value in found.items() if value is not None}


@guarded(_SITE)
def _begin_generate(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], outer: Running | None
) -> Generate | None:
    prompt = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    prompt = prompt if content.shape_of(prompt) else None
    embeds = kwargs.get("inputs_embeds") if prompt is None else None
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    name, encoder_decoder = _model_facts(model)
    prompt_length = prompt.shape[-1] if prompt is not None and not encoder_decoder else 0
    max_new = _setting(config, kwargs, "max_new_tokens")
    if max_new is None:
        longest = _setting(config, kwargs, "max_length")
        max_new = longest - prompt_length if isinstance(longest, int) else None
    parameters = _parameters(config, kwargs, max_new)
    streamer = kwargs.get("streamer")
    tokenizer = kwargs.get("tokenizer") or getattr(streamer, "tokenizer", None)
    eos = _token_ids(_setting(config, kwargs, "eos_token_id"))
    if outer is None:  # its own span: opened last, so that nothing after it can fail
        describe(parameters, prompt if prompt is not None else embeds, model)
        running = _open(TEXT_COMPLETION, name, parameters)
        if running is None:
            return None
    else:
        running = outer
        if not running.generation.generations:  # the first batch's settings stand for the call
            running.generation.span.set_attributes(parameters)
    if streamer is not None:
        kwargs["streamer"] = TimedStreamer(streamer, running.generation)
    mask = kwargs.get("attention_mask")
    return Generate(
        running, outer is None, prompt, mask, embeds, eos, max_new, encoder_decoder, tokenizer
    )


def _new_tokens(call: Generate, sequences: Any) -> tuple[int, list[str], list[list[int]]]:
    """How many new tokens the sequences have (each up to and with its first end-of-text
    token), why each stopped (``stop``: an end-of-text token or a stop string; ``length``: the
    limit), and the new tokens themselves."""
    if call.encoder_decoder:
        start = 1  # the decoder's start token
    else:
        start = call.prompt.shape[-1] if call.prompt is not None else 0
    rows = [row[start:] for row in sequences.tolist()]  # (a slice of lists costs less)
    width = len(rows[0]) if rows else 0
    full = call.max_new is None or width >= call.max_new
    count, reasons = 0, []
    for position, row in enumerate(rows):
        ends = [row.index(token) + 1 for token in call.eos if token in row]
        if ends:
            rows[position] = row = row[: min(ends)]
        count += len(row)
        reasons.append(STOP if ends or not full else LENGTH)
    return count, reasons, rows


def _input_tokens(call: Generate) -> int:
    if call.mask is not None and hasattr(call.mask, "sum"):
        return int(call.mask.sum())
    given = call.prompt if call.prompt is not None else call.embeds
    if given is None:
        return 0
    shape = given.shape
    return int(shape[0] * shape[1]) if len(shape) >= 2 else int(shape[0])


@guarded(_SITE)
def _end_generate(call: Generate, error: BaseException | None, result: Any) -> None:
    running = call.running
    generation = running.generation
    try:
        sequences = getattr(result, "sequences", result)
        if error is None and hasattr(sequences, "tolist") and len(sequences.shape) == 2:
            count, reasons, new = _new_tokens(call, sequences)
            generation.counted(_input_tokens(call), count, reasons)
            capture = generation.capture
            if capture.tensors:
                content.record_shapes(generation.span, call.prompt, sequences)
            if capture.text and call.own and call.tokenizer is not None:
                _decode(call, generation, new)
    finally:
        if call.own:
            _close(running, error)


def _decode(call: Generate, generation: Generation, new: list[list[int]]) -> None:
    """The prompts and completions as text, with the tokenizer the call was given."""
    decode = call.tokenizer.batch_decode
    if call.prompt is not None:
        prompts = decode(call.prompt, skip_special_tokens=True)
        generation.prompts = [(content.USER, text) for text in prompts]
    generation.completions = decode(new, skip_special_tokens=True)


def _traced_generate(original: Any) -> Any:
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = _running.get()
        if outer is not None and not outer.pipeline:  # an assistant model's, inside a generate
            return original(self, *args, **kwargs)
        call = _begin_generate(self, args, kwargs, outer)
        if call is None:
            return original(self, *args, **kwargs)
        token = _running.set(call.running)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            _running.reset(token)
            _end_generate(call, error, None)
            raise
        _running.reset(token)
        _end_generate(call, None, result)
        return result

    return functools.update_wrapper(generate, original)


# -- text-generation pipelines ---------------------------------------------------------------------
def _is_chat(inputs: Any) -> bool:
    """A chat (a list of role/content messages), or a list of chats."""
    if isinstance(inputs, Mapping):
        return True
    if isinstance(inputs, Sequence) and not isinstance(inputs, str) and inputs:
        first = inputs[0]
        return isinstance(first, Mapping) or (
            isinstance(first, Sequence) and not isinstance(first, str) and _is_chat(first)
        )
    return False


def _inputs_count(inputs: Any, chat: bool) -> int:
    """How many prompts: one text or chat, or the length of a list of them."""
    if isinstance(inputs, str) or (chat and isinstance(inputs[0], Mapping)):
        return 1
    return len(inputs)


@guarded(_SITE)
def _begin_pipeline(pipe: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Running | None:
    inputs = args[0] if args else kwargs.get("text_inputs")
    prompts = content.input_messages(inputs)
    if prompts is None:  # a generator or a dataset: it generates later, call by call
        return None
    chat = _is_chat(inputs)
    given: dict[str, Any] = {semconv.BATCH_SIZE: _inputs_count(inputs, chat)}
    device = content.device_of(pipe.model)
    if device is not None:
        given[semconv.DEVICE] = device
    running = _open(CHAT if chat else TEXT_COMPLETION, _model_facts(pipe.model)[0], given)
    if running is None:
        return None
    running.pipeline = True
    if running.generation.capture.text:
        running.generation.prompts = prompts
    return running


@guarded(_SITE)
def _end_pipeline(running: Running, error: BaseException | None, result: Any) -> None:
    try:
        if result is not None and running.generation.capture.text:
            running.generation.completions = content.output_texts(result)
    finally:
        _close(running, error)


def _traced_pipeline(original: Any) -> Any:
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        running = _begin_pipeline(self, args, kwargs) if _running.get() is None else None
        if running is None:
            return original(self, *args, **kwargs)
        token = _running.set(running)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            _running.reset(token)
            _end_pipeline(running, error, None)
            raise
        _running.reset(token)
        _end_pipeline(running, None, result)
        return result

    return functools.update_wrapper(__call__, original)
