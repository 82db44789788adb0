"""A tiny GPT-2 and its tokenizer, made here: random weights from a config, a word-level
vocabulary built in memory. Nothing is downloaded. For the inference tests and their scripts."""

from __future__ import annotations

from typing import Any

WORDS = "the cat sat on a mat and dog ran far away my key is please say hello".split()


def tokenizer() -> Any:
    """A word-level tokenizer over :data:`WORDS` (``<eos>`` pads), with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {word: i for i, word in enumerate(["<eos>", "<unk>", *WORDS])}
    model = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.decoder = decoders.WordPiece()
    made = PreTrainedTokenizerFast(
        tokenizer_object=model, eos_token="<eos>", unk_token="<unk>", pad_token="<eos>"
    )
    made.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return made


def gpt2(eos: int = 0) -> Any:
    """One layer, 16 wide, in eval mode. ``eos``: its end-of-text token (99: one it never
    makes, so that every sequence runs to its token limit)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=len(WORDS) + 2,
        n_positions=64,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config).eval()
