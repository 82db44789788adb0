"""Inference spans of models on a CUDA device: the device named, the token counts read from
device tensors. Skipped where there is no CUDA device (CI has none); run on a GPU machine."""

from __future__ import annotations

import pytest

import cirron as ci
from cirron.otel import semconv
from trees import kids

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from tiny_llm import gpt2, tokenizer  # noqa: E402

SPAN = "text_completion GPT2LMHeadModel"


def test_generate_on_cuda_counts_its_tokens_and_names_the_device():
    ci.profile(frameworks=["torch", "transformers"], output="none", metrics=False)
    model, words = gpt2(eos=0).to("cuda"), tokenizer()
    inputs = words(["the cat sat on", "a dog ran far"], return_tensors="pt").to("cuda")
    output = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    new = output[:, 4:].tolist()
    expected = sum(row.index(0) + 1 if 0 in row else len(row) for row in new)
    (span,) = ci.trace(format="dict", name=SPAN)
    found = span["attributes"]
    assert found[semconv.DEVICE] == "cuda:0"
    assert found[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 8
    assert found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == expected
    assert len(kids(span, "forward")) >= 1


def test_an_inference_function_on_cuda_tensors_names_the_device():
    ci.profile(frameworks=["torch", "transformers"], output="none", metrics=False)
    model = gpt2(eos=99).to("cuda")

    @ci.inference("complete", model=model)
    def complete(prompt):
        return model.generate(prompt, max_new_tokens=3, do_sample=False)

    complete(torch.tensor([[2, 3, 4]], device="cuda"))
    (span,) = ci.trace(format="dict", name="complete")
    assert span["attributes"][semconv.DEVICE] == "cuda:0"
    assert span["attributes"][semconv.BATCH_SIZE] == 1
    (inner,) = kids(span, SPAN)
    assert inner["attributes"][semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 3


def test_a_pipeline_on_cuda_is_one_span():
    from transformers import pipeline

    ci.profile(frameworks=["torch", "transformers"], output="none", metrics=False)
    generator = pipeline("text-generation", model=gpt2(eos=99), tokenizer=tokenizer(), device=0)
    generator("the cat sat", max_new_tokens=2, do_sample=False)
    (span,) = ci.trace(format="dict", name=SPAN)
    assert span["attributes"][semconv.DEVICE] == "cuda:0"
    assert span["attributes"][semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
