"""A tiny HuggingFace Trainer run (random GPT-2, no download), profiled, that prints its trace.

    pip install -e ".[transformers]"
    python examples/train_transformers.py [--epochs 2] [--accumulation 2]

The Trainer needs nothing from cirron but ``ci.profile()``: its epochs, optimizer
steps, evaluation and logged values become spans and marks, and its model is
snapshotted once an epoch.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import cirron as ci


class RandomTokens(torch.utils.data.Dataset):
    """Token sequences made up in memory: a causal LM learns to predict them."""

    def __init__(self, samples: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (samples, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--output", default="spool", help="spool, log, stdout or none")
    args = parser.parse_args()

    ci.profile(output=args.output)  # the one line
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = Trainer(
            model=GPT2LMHeadModel(config),
            args=TrainingArguments(
                output_dir=output_dir,
                num_train_epochs=args.epochs,
                per_device_train_batch_size=8,
                gradient_accumulation_steps=args.accumulation,
                eval_strategy="epoch",
                logging_strategy="epoch",
                save_strategy="no",
                report_to=[],
                use_cpu=True,
                disable_tqdm=True,
            ),
            train_dataset=RandomTokens(64, seed=1),
            eval_dataset=RandomTokens(16, seed=2),
        )
        trainer.train()
    ci.shutdown()
    print(ci.trace())


if __name__ == "__main__":
    main()
