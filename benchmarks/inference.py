"""What tracing inference costs: a ``@ci.inference`` call, and ``generate`` on a tiny GPT-2.

- A decorated no-op function: the time ``@ci.inference`` adds to a call (the plain call's time
  subtracted), beside an empty ``ci.scope`` measured in the same rounds; and the same with a
  tensor argument, whose batch size and device it reads.
- ``model.generate`` on two tiny GPT-2s (built from a config, random weights, one torch
  thread, 8 prompt tokens): the tests' (1 layer, 16 wide) making 5 new tokens, and the
  configuration of HF's own ``tiny-random-gpt2`` test model (5 layers, 32 wide, a vocabulary
  of 1,000) making 20. Per call with every hook on, and the share the ``generate`` span adds
  (torch's hooks alone against torch's and transformers'), and all of cirron adds (no
  profiler against both), in interleaved rounds. The span's cost is per call, so its share
  falls as the call grows.

Calling-thread CPU time, median over rounds, each kind in fresh processes of its own
(:func:`benchmarks.reference.run_snippet`). The reference SDK has no inference API: its
columns are empty.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import cirron as ci

from . import reference
from .table import Row, half_iqr

Case = Callable[[int], None]


def _noop() -> None:
    return None


def _call_cases() -> dict[str, Case]:
    traced = ci.inference(_noop)
    tensor_traced = ci.inference(lambda batch: None)
    try:
        import torch

        batch: Any = torch.zeros(8, 4)
    except ImportError:  # the tensor case needs torch
        batch = None

    def bare(n: int) -> None:
        for _ in range(n):
            _noop()

    def decorated(n: int) -> None:
        for _ in range(n):
            traced()

    def with_tensor(n: int) -> None:
        for _ in range(n):
            tensor_traced(batch)

    def scope(n: int) -> None:
        open_scope = ci.scope
        for _ in range(n):
            with open_scope("x"):
                pass

    return {"bare": bare, "decorated": decorated, "tensor": with_tensor, "scope": scope}


def measure_calls(n: int, rounds: int) -> dict[str, list[float]]:
    """ns per call of each case, per round; runs in a fresh process."""
    ci.profile(output="none", frameworks=[], metrics=False)
    cases = _call_cases()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            started = time.thread_time_ns()
            case(n)
            samples[name].append((time.thread_time_ns() - started) / n)
        ci.flush()
    ci.shutdown()
    return samples


# The two models: (layers, heads, width, vocabulary, new tokens).
MODELS = {"tests": (1, 2, 16, 20, 5), "tiny-random": (5, 4, 32, 1000, 20)}


def _tiny_gpt2(model: str) -> Case:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    layers, heads, width, vocabulary, new_tokens = MODELS[model]
    logging.set_verbosity_error()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=vocabulary,
                        n_positions=64, bos_token_id=0, eos_token_id=vocabulary + 1,
                        pad_token_id=0)  # fmt: skip
    gpt2 = GPT2LMHeadModel(config).eval()
    prompt = torch.randint(1, vocabulary, (1, 8))

    def generate(n: int) -> None:
        for _ in range(n):
            gpt2.generate(prompt, max_new_tokens=new_tokens, do_sample=False)

    return generate


# What runs in each half of a round: no profiler, torch's hooks, torch's and transformers'.
_MODES: dict[str, list[str] | None] = {
    "bare": None,
    "hooks": ["torch"],
    "traced": ["torch", "transformers"],
}


def measure_generate(model: str, calls: int, rounds: int) -> dict[str, list[float]]:
    """ns per ``generate`` call of ``model`` in each mode, per round (modes rotate); a fresh
    process."""
    import torch

    torch.set_num_threads(1)
    generate = _tiny_gpt2(model)
    generate(3)  # first calls: allocator, caches
    samples: dict[str, list[float]] = {mode: [] for mode in _MODES}
    names = list(_MODES)
    for index in range(rounds):
        for mode in names[index % 3 :] + names[: index % 3]:
            ci.shutdown()
            frameworks = _MODES[mode]
            if frameworks is not None:
                ci.profile(output="none", frameworks=frameworks, metrics=False)
            generate(2)
            started = time.thread_time_ns()
            generate(calls)
            samples[mode].append((time.thread_time_ns() - started) / calls)
    ci.shutdown()
    return samples


def _added(samples: list[dict[str, list[float]]], case: str, base: str) -> list[float]:
    """Per round of every process: ``case`` less ``base``."""
    return [
        on - off for result in samples for on, off in zip(result[case], result[base], strict=True)
    ]


def _share(samples: list[dict[str, list[float]]], case: str, base: str) -> tuple[float, float]:
    """Median and half-IQR, over rounds, of what ``case`` adds to ``base``, in percent."""
    shares = [
        100 * (on - off) / off
        for result in samples
        for on, off in zip(result[case], result[base], strict=True)
    ]
    return statistics.median(shares), half_iqr(shares) or 0.0


def run(quick: bool = False) -> list[Row]:
    """The decorated call's added time, and the share tracing adds to ``generate``."""
    n, rounds, runs = (2_000, 2, 1) if quick else (10_000, 5, 3)
    code = reference.call_snippet("inference", "measure_calls", n=n, rounds=rounds)
    calls = [reference.run_snippet(code) for _ in range(runs)]
    decorated, tensor = _added(calls, "decorated", "bare"), _added(calls, "tensor", "bare")
    scope = _added(calls, "scope", "bare")
    rows = [
        Row("@ci.inference no-op call, added", statistics.median(decorated), "empty ci.scope",
            statistics.median(scope), "us", spread=half_iqr(decorated)),
        Row("  with a tensor argument", statistics.median(tensor), "empty ci.scope",
            statistics.median(scope), "us", spread=half_iqr(tensor)),
    ]  # fmt: skip
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("(transformers is not installed: the generate rows are skipped)")
        return rows
    for model, title in (
        ("tests", "generate, 1-layer GPT-2, 5 tokens"),
        ("tiny-random", "generate, tiny-random-gpt2, 20 tokens"),
    ):
        rows += _generate_rows(model, title, quick)
    return rows


def _generate_rows(model: str, title: str, quick: bool) -> list[Row]:
    calls, rounds, runs = (2, 3, 1) if quick else (10, 15, 2)
    code = reference.call_snippet(
        "inference", "measure_generate", model=model, calls=calls, rounds=rounds
    )
    generated = [reference.run_snippet(code) for _ in range(runs)]
    traced = statistics.median(v for result in generated for v in result["traced"])
    bare = statistics.median(v for result in generated for v in result["bare"])
    added = _added(generated, "traced", "hooks")
    span_share, span_spread = _share(generated, "traced", "hooks")
    all_share, all_spread = _share(generated, "traced", "bare")
    return [
        Row(title, traced, "same call, no profiler", bare, "us"),
        Row("  added by the generate span", span_share, unit="%", spread=span_spread),
        Row("  the same, per call", statistics.median(added), unit="us", spread=half_iqr(added)),
        Row("  added by all hooks (+ forwards)", all_share, unit="%", spread=all_spread),
    ]
