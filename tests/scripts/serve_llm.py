"""A tiny LLM service, for the end-to-end tests: prompts through ``@ci.inference`` and
``model.generate`` (a tiny GPT-2, see tests/tiny_llm.py).

Prints one JSON line, the token counts transformers itself returned, for the test to compare
with what the backend shows. ``--profile`` calls ``ci.profile()``; without it the script is
traced only under ``opentelemetry-instrument``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_llm

import cirron as ci  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--profile", action="store_true", help="call ci.profile() first")
parser.add_argument("--prompt", default="the cat sat on the mat")
arguments = parser.parse_args()
if arguments.profile:
    ci.profile()

import torch  # noqa: E402

import tiny_llm  # noqa: E402

torch.set_num_threads(1)
words, model = tiny_llm.tokenizer(), tiny_llm.gpt2(eos=99)


@ci.inference("serve", model=model)
def serve(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = words(prompts, return_tensors="pt")
    return inputs["input_ids"], model.generate(**inputs, max_new_tokens=5, do_sample=False)


prompt_ids, output = serve([arguments.prompt])
new_tokens = output.shape[1] - prompt_ids.shape[1]
print(json.dumps({"input_tokens": prompt_ids.numel(), "output_tokens": new_tokens}))
