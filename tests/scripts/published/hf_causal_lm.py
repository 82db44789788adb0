"""Causal language modelling in the shape of transformers' run_clm.py: a raw text corpus is
tokenized, concatenated and cut into blocks; a GPT-2 (a tiny config, random weights) is
trained by the Trainer with gradient checkpointing and an accuracy metric computed from
``preprocess_logits_for_metrics``, evaluated each epoch, evaluated once more after
training, and saved.

Implied: 2 epochs of 3 steps (24 blocks, batches of 4, 2 batches an optimizer step), a
validate pass in each epoch, one evaluate pass after training; the blocks gradient
checkpointing recomputes are neither training forwards nor errors.
"""

from __future__ import annotations

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BLOCK = 16
CORPUS = " ".join(
    f"the {animal} {verb} over the {thing} number {n}."
    for n, (animal, verb, thing) in enumerate(
        [("fox", "jumps", "dog"), ("cat", "walks", "fence"), ("bird", "flies", "tree")] * 12
    )
)


def tokenize(texts: list[str], vocabulary: dict[str, int]) -> list[list[int]]:
    return [[vocabulary[c] for c in text] for text in texts]


def group_texts(token_lists: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """Concatenate everything, then cut blocks of BLOCK tokens (the remainder is dropped)."""
    joined = [t for tokens in token_lists for t in tokens]
    total = len(joined) // BLOCK * BLOCK
    blocks = [joined[i : i + BLOCK] for i in range(0, total, BLOCK)]
    return [{"input_ids": torch.tensor(b), "labels": torch.tensor(b)} for b in blocks]


def preprocess_logits_for_metrics(logits, labels):
    return logits.argmax(dim=-1)


def compute_metrics(prediction):
    predicted, labels = prediction
    return {"accuracy": float((predicted[:, :-1] == labels[:, 1:]).mean())}


if __name__ == "__main__":
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    vocabulary = {c: i for i, c in enumerate(sorted(set(CORPUS)))}
    sentences = CORPUS.split(".")
    blocks = group_texts(tokenize(sentences, vocabulary))
    train_blocks, eval_blocks = blocks[:24], blocks[24:32]
    config = GPT2Config(
        vocab_size=len(vocabulary), n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    arguments = TrainingArguments(
        output_dir="clm-out",
        do_train=True,
        do_eval=True,
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        gradient_checkpointing=True,
        eval_strategy="epoch",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=train_blocks,
        eval_dataset=eval_blocks,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    result = trainer.train()
    trainer.save_model()
    metrics = trainer.evaluate()
    print("train loss", result.training_loss, "eval accuracy", metrics["eval_accuracy"])
