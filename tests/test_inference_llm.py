"""LLM calls with transformers, traced with no code change: ``model.generate`` and pipelines.

A tiny GPT-2 built from a config (random weights, no download) and a word-level
tokenizer built in memory; the spans read back with ``ci.trace(format="dict")``
and compared with the tensors and texts transformers itself returned.
"""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pytest

import cirron as ci
from cirron.otel import semconv
from trees import kids, named, walk

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from transformers import TextIteratorStreamer, pipeline  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402

from tiny_llm import gpt2, tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
transformers.logging.set_verbosity_error()

SPAN = "text_completion GPT2LMHeadModel"  # "{gen_ai.operation.name} {gen_ai.request.model}"
SECRET = "sk-proj-Zq8Xv2Lm4Np6Rt8Vw0Yb"


@pytest.fixture
def profiled():
    return ci.profile(frameworks=["torch", "transformers"], metrics=False)


def calls(name: str = SPAN) -> list[dict]:
    return ci.trace(format="dict", name=name)


def attributes(name: str = SPAN) -> dict:
    (span,) = calls(name)
    return span["attributes"]


# -- model.generate ----------------------------------------------------------------------------
def test_generate_is_one_span_whose_token_counts_are_the_tensors_lengths(profiled):
    model, words = gpt2(eos=99), tokenizer()  # an eos it never makes: every row runs to the limit
    inputs = words(["the cat sat on", "a dog ran far"], return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    (span,) = calls()
    found = span["attributes"]
    assert found[semconv.GEN_AI_OPERATION_NAME] == "text_completion"
    assert found[semconv.GEN_AI_PROVIDER_NAME] == "huggingface"
    assert found[semconv.GEN_AI_REQUEST_MODEL] == "GPT2LMHeadModel"
    assert found[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 5
    assert found[semconv.GEN_AI_USAGE_INPUT_TOKENS] == inputs["input_ids"].numel() == 8
    new_tokens = output.shape[1] - inputs["input_ids"].shape[1]
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == output.shape[0] * new_tokens == 10
    assert found[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["length", "length"]
    assert found[semconv.BATCH_SIZE] == 2 and found[semconv.DEVICE] == "cpu"
    assert found[semconv.TOKENS_PER_SECOND] > 0
    assert semconv.GEN_AI_REQUEST_TEMPERATURE not in found  # greedy: no sampling settings
    # Its forwards (one per new token) are its children, in eval mode.
    forwards = kids(span, "forward")
    assert len(forwards) == 5 and {f["attributes"]["mode"] for f in forwards} == {"eval"}


def test_a_sequence_that_ends_early_counts_its_tokens_up_to_its_end(profiled):
    model, words = gpt2(eos=0), tokenizer()  # the first prompt's first new token is <eos>
    inputs = words(["the cat sat on", "a dog ran far"], return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    new = output[:, 4:].tolist()
    assert new[0][0] == 0 and 0 not in new[1]  # the first ended at once, padded after
    found = attributes()
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1 + 6
    assert found[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop", "length"]


def test_sampling_settings_and_choices_are_the_requests(profiled):
    model = gpt2(eos=99)
    prompt = torch.tensor([[2, 3]])
    output = model.generate(
        prompt,
        max_new_tokens=3,
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        num_return_sequences=3,
    )
    found = attributes()
    assert found[semconv.GEN_AI_REQUEST_TEMPERATURE] == pytest.approx(0.7)
    assert found[semconv.GEN_AI_REQUEST_TOP_P] == pytest.approx(0.9)
    assert found[semconv.GEN_AI_REQUEST_TOP_K] == 5
    assert found[semconv.GEN_AI_REQUEST_CHOICE_COUNT] == 3
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == output.shape[0] * 3 == 9
    assert len(found[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == 3


def test_generate_over_a_dataloader_of_prompts_is_a_pass_each_and_opens_no_evaluate(profiled):
    model = gpt2(eos=99)
    prompts = torch.utils.data.DataLoader(torch.randint(2, 10, (4, 3)), batch_size=2)
    for batch in prompts:
        model.generate(batch, max_new_tokens=2, do_sample=False)
    root = ci.trace(format="dict")
    assert named(root, "evaluate") == [] and named(root, "validate") == []
    generations = kids(root, SPAN)
    assert len(generations) == 2
    for span in generations:  # the model's forwards are inside, the loader's fetches outside
        assert [c["name"] for c in span["children"]] == ["forward", "forward"]
    assert len(kids(root, "data_load")) == 3  # two batches, and the fetch that found it dry


def test_generate_inside_an_inference_function_nests_under_it(profiled):
    model = gpt2(eos=99)

    @ci.inference("complete")
    def complete(prompt):
        return model.generate(prompt, max_new_tokens=2, do_sample=False)

    complete(torch.tensor([[2, 3]]))
    (outer,) = calls("complete")
    (inner,) = kids(outer, SPAN)
    assert len(kids(inner, "forward")) == 2


def test_a_generate_that_raises_keeps_its_error_status(profiled):
    model = gpt2()
    with pytest.raises(ValueError):
        model.generate(
            torch.tensor([[2, 3]]), max_new_tokens=2, num_beams=2, num_return_sequences=3
        )
    (span,) = calls()
    assert span["status"] == "ERROR"
    assert span["attributes"][semconv.ERROR_TYPE] == "ValueError"
    assert [e["name"] for e in span["events"]] == ["exception"]
    # The pass ended with it: the next call is a span of its own, at the top.
    model.generate(torch.tensor([[2, 3]]), max_new_tokens=1, do_sample=False)
    assert len(kids(ci.trace(format="dict"), SPAN)) == 2


# -- streamers ------------------------------------------------------------------------------------
class Recording(BaseStreamer):
    """A user's own streamer: keeps what generate hands it."""

    def __init__(self):
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.tolist())

    def end(self):
        self.ended = True


def test_a_streamer_gives_the_time_to_the_first_token(profiled):
    model, streamer = gpt2(eos=99), Recording()
    prompt = torch.tensor([[2, 3, 4]])
    model.generate(prompt, max_new_tokens=4, do_sample=False, streamer=streamer)
    assert streamer.ended and streamer.chunks[0] == [[2, 3, 4]]  # the user's streamer works
    assert len(streamer.chunks) == 5  # the prompt, then each new token
    (span,) = calls()
    found = span["attributes"]
    assert found[semconv.GEN_AI_REQUEST_STREAM] is True
    first = found[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    assert 0 < first * 1e9 < span["duration_ns"]


def test_a_text_iterator_streamer_read_in_another_thread(profiled):
    model, words = gpt2(eos=99), tokenizer()
    streamer = TextIteratorStreamer(words, skip_prompt=True)
    inputs = words("the cat sat", return_tensors="pt")
    worker = threading.Thread(
        target=model.generate,
        kwargs=dict(**inputs, max_new_tokens=4, do_sample=False, streamer=streamer),
    )
    worker.start()
    text = "".join(streamer)
    worker.join()
    assert text.strip()
    found = attributes()
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert found[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] > 0


# -- pipelines ------------------------------------------------------------------------------------
def test_a_pipeline_call_is_one_span_with_its_generations_token_counts(profiled):
    words = tokenizer()
    generator = pipeline("text-generation", model=gpt2(eos=99), tokenizer=words, device="cpu")
    result = generator(["the cat sat", "a dog ran far away"], max_new_tokens=3, do_sample=False)
    assert len(result) == 2
    (span,) = calls()  # one span for the call, none for the generate calls it made
    found = span["attributes"]
    assert found[semconv.GEN_AI_OPERATION_NAME] == "text_completion"
    assert found[semconv.BATCH_SIZE] == 2
    assert found[semconv.GEN_AI_REQUEST_MAX_TOKENS] == 3
    assert found[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 3 + 5
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2 * 3
    assert found[semconv.GEN_AI_RESPONSE_FINISH_REASONS] == ["length", "length"]
    assert found[semconv.BATCHES] == 2  # one generate per prompt (batch_size 1)
    assert len(kids(span, "forward")) == 6
    assert semconv.GEN_AI_INPUT_MESSAGES not in found  # no text unless capture says so


def test_a_chat_pipeline_call_is_a_chat_span(profiled):
    generator = pipeline("text-generation", model=gpt2(eos=99), tokenizer=tokenizer())
    chat = [{"role": "user", "content": "say hello"}]
    result = generator(chat, max_new_tokens=2, do_sample=False)
    assert result[0]["generated_text"][-1]["role"] == "assistant"
    found = attributes("chat GPT2LMHeadModel")
    assert found[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


# -- capture: off by default, on when asked, secrets never ------------------------------------------
def _everything_written(directory: Path) -> str:
    """The text of every file under ``directory``, gzip-compressed ones inflated (the spool)."""
    texts = []
    for path in directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
            texts.append(data.decode("utf-8", errors="replace"))
    return "\n".join(texts)


def _run_a_pipeline_and_a_generate(prompt: str) -> None:
    words = tokenizer()
    model = gpt2(eos=99)
    generator = pipeline("text-generation", model=model, tokenizer=words)
    generator(prompt, max_new_tokens=2, do_sample=False)
    inputs = words(prompt, return_tensors="pt")
    model.generate(**inputs, max_new_tokens=2, do_sample=False, tokenizer=words)


def test_no_prompt_text_anywhere_in_the_spool_by_default(tmp_path):
    ci.profile(frameworks=["torch", "transformers"])
    prompt = "please say hello my key is " + SECRET
    _run_a_pipeline_and_a_generate(prompt)
    ci.shutdown()
    written = _everything_written(tmp_path / ".cirron")
    assert SPAN in written  # the spans are there
    assert "please say hello" not in written and SECRET not in written
    assert semconv.GEN_AI_INPUT_MESSAGES not in written


def test_captured_text_is_in_the_spool_with_the_secret_redacted(tmp_path):
    ci.profile(frameworks=["torch", "transformers"], capture={"text": True, "max_chars": 200})
    prompt = "please say hello my key is " + SECRET
    _run_a_pipeline_and_a_generate(prompt)
    pipeline_call, generate_call = calls()
    prompts = []
    for span in (pipeline_call, generate_call):
        (message,) = json.loads(span["attributes"][semconv.GEN_AI_INPUT_MESSAGES])
        assert message["role"] == "user"
        prompts.append(message["parts"][0]["content"])
        (reply,) = json.loads(span["attributes"][semconv.GEN_AI_OUTPUT_MESSAGES])
        assert reply["role"] == "assistant" and reply["finish_reason"] == "length"
    # The pipeline's text as given, the key redacted; generate's decoded from the tokens (the
    # tokenizer does not know the key: it decodes to nothing).
    assert prompts == ["please say hello my key is [REDACTED]", "please say hello my key is"]
    ci.shutdown()
    written = _everything_written(tmp_path / ".cirron")
    assert "please say hello" in written and "[REDACTED]" in written
    assert SECRET not in written


def test_the_opentelemetry_variable_captures_text_as_an_event(monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
    ci.profile(frameworks=["torch", "transformers"], output="none", metrics=False)
    generator = pipeline("text-generation", model=gpt2(eos=99), tokenizer=tokenizer())
    generator("the cat sat", max_new_tokens=2, do_sample=False)
    (span,) = calls()
    assert semconv.GEN_AI_INPUT_MESSAGES not in span["attributes"]
    (event,) = [e for e in span["events"] if e["name"] == semconv.GEN_AI_OPERATION_DETAILS]
    assert json.loads(event["attributes"][semconv.GEN_AI_INPUT_MESSAGES])[0]["parts"][0][
        "content"
    ] == ("the cat sat")


def test_capture_of_shapes_only_records_no_text(profiled):
    ci.shutdown()
    ci.profile(frameworks=["torch", "transformers"], output="none", capture={"tensors": "shapes"})
    model = gpt2(eos=99)
    model.generate(torch.tensor([[2, 3, 4]]), max_new_tokens=2, do_sample=False)
    found = attributes()
    assert found[semconv.INPUT_SHAPE] == [1, 3]
    assert found[semconv.OUTPUT_SHAPE] == [1, 5]
    assert semconv.GEN_AI_INPUT_MESSAGES not in found


# -- the instrumentor's life cycle ------------------------------------------------------------------
def test_uninstrument_restores_generate_and_the_pipeline(profiled):
    from transformers.generation.utils import GenerationMixin
    from transformers.pipelines.text_generation import TextGenerationPipeline

    assert GenerationMixin.generate.__name__ == "generate"
    assert hasattr(GenerationMixin.generate, "__wrapped__")
    originals = (GenerationMixin.generate.__wrapped__, TextGenerationPipeline.__call__.__wrapped__)
    ci.shutdown()
    assert (GenerationMixin.generate, TextGenerationPipeline.__call__) == originals
    ci.profile(frameworks=["torch", "transformers"], output="none")
    gpt2(eos=99).generate(torch.tensor([[2]]), max_new_tokens=1, do_sample=False)
    assert len(calls()) == 1


def test_every_span_of_a_generation_ends(profiled):
    model = gpt2(eos=99)
    model.generate(torch.tensor([[2, 3]]), max_new_tokens=3, do_sample=False)
    for span in walk(ci.trace(format="dict")):
        if span["name"] != "cirron.session":
            assert span["end_ns"] is not None, span["name"]


# -- with plain OpenTelemetry ------------------------------------------------------------------------
STANDALONE = """
    import json, sys
    sys.path.insert(0, {tests!r})
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from cirron.instrumentors.transformers import TransformersInstrumentor

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TransformersInstrumentor().instrument(tracer_provider=provider)

    import tiny_llm
    words, model = tiny_llm.tokenizer(), tiny_llm.gpt2(eos=99)
    inputs = words("the cat sat", return_tensors="pt")
    model.generate(**inputs, max_new_tokens=2, do_sample=False, tokenizer=words)
    TransformersInstrumentor().uninstrument()
    (span,) = exporter.get_finished_spans()
    print("RESULT " + json.dumps({{"name": span.name, "attributes": dict(span.attributes)}}))
"""


@pytest.mark.slow
def test_with_plain_opentelemetry_generate_reaches_the_users_provider_and_the_otel_variable(
    tmp_path,
):
    from support import run_python

    code = STANDALONE.format(tests=str(Path(__file__).resolve().parent))
    result = run_python(
        code,
        cwd=tmp_path,
        env={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    span = json.loads(line.removeprefix("RESULT "))
    assert span["name"] == SPAN
    found = span["attributes"]
    assert found[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 3
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    (prompt,) = json.loads(found[semconv.GEN_AI_INPUT_MESSAGES])
    assert prompt["parts"][0]["content"] == "the cat sat"
