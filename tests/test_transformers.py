"""The HuggingFace Trainer instrumentor on real Trainer runs: tiny random GPT-2 and BERT models.

Each test is a user's script: ``ci.profile(...)``, a model built from a
config (no download), an in-memory dataset, ``Trainer(...).train()``; then
the spans read back with ``ci.trace(format="dict")`` and compared with what
the Trainer itself reports (``state.log_history``, ``TrainOutput``).
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

import cirron as ci
from trees import kids, named, walk

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import cirron.training  # noqa: E402
from cirron.instrumentors.transformers import callback_class  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
transformers.logging.set_verbosity_error()


# -- tiny models, in-memory data ---------------------------------------------------------------
class Tokens(torch.utils.data.Dataset):
    """Random token sequences; ``labels`` for a causal LM, or a class per sequence."""

    def __init__(self, samples: int, seed: int, classes: int | None = None) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 50, (samples, 8), generator=generator)
        self.classes = (
            torch.randint(0, classes, (samples,), generator=generator) if classes else None
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.classes is None:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(8, dtype=torch.long),
            "labels": self.classes[i],
        }


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=50,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    return BertForSequenceClassification(config)


def arguments(tmp_path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="epoch",
        logging_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


# -- reading the tree back ---------------------------------------------------------------------


def summaries(node):
    return {m["name"]: m["value"] for m in node["marks"] if m["kind"] == "summary"}


def points(node):
    return {m["name"]: m["value"] for m in node["marks"] if m["kind"] == "point"}


def assert_one_epoch_level_and_one_step_level(session):
    """Never an epoch in an epoch or a step, never a step in a step."""
    for epoch in named(session, "epoch"):
        assert [n["name"] for n in walk(epoch)][1:].count("epoch") == 0
    for step in named(session, "step") + named(session, "batch"):
        inside = [n["name"] for n in walk(step)][1:]
        assert not {"epoch", "step", "batch", "validate"} & set(inside), inside


def finished_tree():
    ci.shutdown()
    return ci.trace(format="dict")


# -- 1. a causal LM, epochs and steps -----------------------------------------------------------
@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_one_epoch_per_epoch_and_one_step_per_optimizer_step(tmp_path, model, accumulation):
    ci.profile(output="none")
    classes = 3 if model == "bert" else None
    trainer = Trainer(
        model=gpt2() if model == "gpt2" else bert(),
        args=arguments(tmp_path, gradient_accumulation_steps=accumulation),
        train_dataset=Tokens(32, seed=1, classes=classes),  # 8 batches an epoch
        eval_dataset=Tokens(8, seed=2, classes=classes),  # 2 evaluation batches
    )
    output = trainer.train()
    session = finished_tree()

    assert_one_epoch_level_and_one_step_level(session)
    (train,) = kids(session, "train")
    epochs = kids(train, "epoch")
    assert [e["index"] for e in epochs] == [0, 1]
    updates = 8 // accumulation
    steps = named(session, "step")
    assert (
        [s["index"] for s in steps] == list(range(2 * updates)) == list(range(output.global_step))
    )
    for epoch in epochs:
        assert len(kids(epoch, "step")) == updates
        for step in kids(epoch, "step"):
            names = Counter(c["name"] for c in step["children"])
            assert (names["forward"], names["backward"], names["optimizer_step"]) == (
                accumulation,
                accumulation,
                1,
            )
            # The Trainer fetches a step's batches before on_step_begin: they are inside it.
            assert names["data_load"] >= accumulation
            assert all(f["attributes"]["mode"] == "train" for f in kids(step, "forward"))


class Stream(torch.utils.data.IterableDataset):
    """Token sequences from a stream of unknown length (``samples`` a pass)."""

    def __init__(self, samples: int) -> None:
        self.tokens = Tokens(samples, seed=1)

    def __iter__(self):
        return (self.tokens[i] for i in range(len(self.tokens)))


@pytest.mark.parametrize("accumulation", [1, 2])
def test_an_iterable_dataset_gives_one_step_per_optimizer_step_and_counts_its_passes(
    tmp_path, accumulation
):
    ci.profile(output="none")
    trainer = Trainer(
        model=gpt2(),
        args=arguments(tmp_path, max_steps=6, gradient_accumulation_steps=accumulation,
                       eval_strategy="no"),
        train_dataset=Stream(16 * accumulation),  # 4 optimizer steps a pass
    )  # fmt: skip
    output = trainer.train()
    session = finished_tree()
    assert_one_epoch_level_and_one_step_level(session)
    epochs = named(session, "epoch")
    assert [e["index"] for e in epochs] == [0, 1]  # a pass each, counted
    assert [[s["index"] for s in kids(e, "step")] for e in epochs] == [[0, 1, 2, 3], [4, 5]]
    assert output.global_step == 6
    for step in named(session, "step"):  # no empty step where a pass ran dry
        assert len(kids(step, "forward")) == accumulation and kids(step, "optimizer_step")


def test_evaluation_during_training_is_a_validate_span_inside_its_epoch(tmp_path):
    ci.profile(output="none")
    trainer = Trainer(
        model=gpt2(),
        args=arguments(tmp_path),
        train_dataset=Tokens(16, seed=1),
        eval_dataset=Tokens(8, seed=2),
    )
    trainer.train()
    session = finished_tree()
    by_id = {n["span_id"]: n for n in walk(session)}
    validates = named(session, "validate")
    assert len(validates) == 2
    for index, validate in enumerate(validates):
        epoch = by_id[validate["parent_id"]]
        assert (epoch["name"], epoch["index"], validate["index"]) == ("epoch", index, index)
        assert validate["attributes"]["batches"] == 2
        forwards = kids(validate, "forward")
        assert [f["attributes"]["mode"] for f in forwards] == ["eval", "eval"]
        assert validate["start_ns"] >= kids(epoch, "step")[-1]["end_ns"]


# -- 2. marks with HF's own values ------------------------------------------------------------------
def test_epoch_logs_and_evaluation_metrics_are_summary_marks_on_their_epoch(tmp_path):
    ci.profile(output="none")
    trainer = Trainer(
        model=gpt2(),
        args=arguments(tmp_path),
        train_dataset=Tokens(16, seed=1),
        eval_dataset=Tokens(8, seed=2),
    )
    output = trainer.train()
    session = finished_tree()
    history = trainer.state.log_history
    train_logs = [h for h in history if "loss" in h]
    eval_logs = [h for h in history if "eval_loss" in h]
    epochs = named(session, "epoch")
    for epoch, logged, evaluated in zip(epochs, train_logs, eval_logs, strict=True):
        marks = summaries(epoch)
        assert marks["loss"] == logged["loss"]
        assert marks["learning_rate"] == logged["learning_rate"]
        assert marks["eval_loss"] == evaluated["eval_loss"]
    (validate, _) = named(session, "validate")
    assert summaries(validate)["eval_loss"] == eval_logs[0]["eval_loss"]
    (train,) = named(session, "train")
    assert summaries(train)["train_loss"] == output.metrics["train_loss"]
    assert summaries(train)["train_runtime"] == output.metrics["train_runtime"]


def test_step_logs_are_point_marks_on_the_step_they_describe(tmp_path):
    ci.profile(output="none")
    trainer = Trainer(
        model=bert(),
        args=arguments(tmp_path, logging_strategy="steps", logging_steps=1, eval_strategy="no"),
        train_dataset=Tokens(16, seed=1, classes=3),
    )
    trainer.train()
    session = finished_tree()
    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    steps = named(session, "step")
    assert len(steps) == len(logged) == 8
    for step in steps:
        marks = points(step)
        # HF's step counter is after the step: the log of step index i says step i + 1.
        assert marks["loss"] == logged[step["index"] + 1]["loss"]
        assert marks["grad_norm"] == logged[step["index"] + 1]["grad_norm"]
    assert all(summaries(e) == {} for e in named(session, "epoch"))


# -- 3. evaluate and predict on their own ------------------------------------------------------------
def test_evaluate_and_predict_on_their_own_are_spans_with_their_batches_and_metrics(tmp_path):
    ci.profile(output="none")
    trainer = Trainer(model=bert(), args=arguments(tmp_path), eval_dataset=Tokens(12, 2, classes=3))
    metrics = trainer.evaluate()
    prediction = trainer.predict(Tokens(8, 3, classes=3))
    session = finished_tree()
    (evaluate,) = kids(session, "evaluate")
    assert evaluate["attributes"]["batches"] == 3
    assert summaries(evaluate)["eval_loss"] == metrics["eval_loss"]
    assert [f["attributes"]["mode"] for f in kids(evaluate, "forward")] == ["eval"] * 3
    (predict,) = kids(session, "predict")
    assert predict["attributes"]["batches"] == 2
    assert summaries(predict)["test_loss"] == prediction.metrics["test_loss"]
    assert named(session, "epoch") == named(session, "step") == []


# -- 4. snapshots of the trainer's model -------------------------------------------------------------
def test_the_trainers_model_is_snapshotted_once_an_epoch_with_its_gradients(tmp_path):
    ci.profile(output="none")
    model = bert()
    trainer = Trainer(
        model=model,
        args=arguments(tmp_path, eval_strategy="no"),
        train_dataset=Tokens(16, 1, classes=3),
    )
    trainer.train()
    session = finished_tree()
    for epoch in named(session, "epoch"):
        (snapshot,) = kids(epoch, "snapshot")
        assert snapshot["attributes"]["snapshot.model"] == "BertForSequenceClassification"
        kinds = Counter(e["attributes"]["kind"] for e in snapshot["events"])
        parameters = len(list(model.parameters()))
        assert kinds == {"weight": parameters, "gradient": parameters}


# -- 5. the same training, traced or not ----------------------------------------------------------------
def train_bert(tmp_path, callbacks=()):
    trainer = Trainer(
        model=bert(),
        args=arguments(tmp_path, logging_strategy="steps", logging_steps=1),
        train_dataset=Tokens(16, 1, classes=3),
        eval_dataset=Tokens(8, 2, classes=3),
        callbacks=list(callbacks),
    )
    output = trainer.train()
    return trainer, [h.get("loss") for h in trainer.state.log_history], output.training_loss


def test_losses_are_identical_to_an_unprofiled_run(tmp_path):
    _, plain, plain_total = train_bert(tmp_path / "plain")
    ci.profile(output="none")
    _, traced, traced_total = train_bert(tmp_path / "traced")
    assert traced == plain and traced_total == plain_total


def test_a_users_callback_still_runs_and_ours_is_added_once(tmp_path):
    class Counting(TrainerCallback):
        steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            Counting.steps += 1

    class MyTrainer(Trainer):  # a user's subclass
        pass

    ci.profile(output="none")
    trainer = MyTrainer(
        model=bert(),
        args=arguments(tmp_path, eval_strategy="no"),
        train_dataset=Tokens(8, 1, classes=3),
    )
    trainer.add_callback(Counting())
    trainer.train()
    trainer.train()  # a second run: still one callback of ours
    ours = [c for c in trainer.callback_handler.callbacks if isinstance(c, callback_class())]
    assert len(ours) == 1
    assert Counting.steps == 2 * 4
    session = finished_tree()
    assert len(kids(session, "train")) == 2
    assert [s["index"] for s in named(session, "step")] == list(range(4)) * 2


def test_a_hook_that_raises_does_not_stop_training(tmp_path, monkeypatch, caplog):
    _, plain, _ = train_bert(tmp_path / "plain")

    def broken(*args, **kwargs):
        raise RuntimeError("deliberately broken hook")

    monkeypatch.setattr(cirron.training, "complete_step", broken)  # what on_step_end calls
    ci.profile(output="none")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        _, traced, _ = train_bert(tmp_path / "traced")
    assert traced == plain
    assert ci.health()["hook_errors"] > 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert len(warnings) == 1 and "deliberately broken hook" in warnings[0]


def test_an_error_in_train_reaches_the_user_and_ends_the_spans_with_it(tmp_path):
    class Explodes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise ValueError("user's callback failed")

    ci.profile(output="none")
    trainer = Trainer(
        model=bert(),
        args=arguments(tmp_path, eval_strategy="no"),
        train_dataset=Tokens(16, 1, classes=3),
        callbacks=[Explodes()],
    )
    with pytest.raises(ValueError, match="user's callback failed"):
        trainer.train()
    (train,) = ci.trace(format="dict", name="train")
    (epoch,) = kids(train, "epoch")
    failed = kids(epoch, "step")[-1]
    assert failed["index"] == 2
    for node in (train, epoch, failed):
        assert node["end_ns"] is not None and node["status"] == "ERROR"


def test_uninstrument_restores_the_trainer_exactly(tmp_path):
    before = {name: Trainer.__dict__[name] for name in vars(Trainer)}
    ci.profile(output="none")
    assert Trainer.__dict__["evaluate"] is not before["evaluate"]
    trainer = Trainer(
        model=bert(),
        args=arguments(tmp_path, eval_strategy="no"),
        train_dataset=Tokens(8, 1, classes=3),
    )
    ci.shutdown()
    assert {name: Trainer.__dict__[name] for name in vars(Trainer)} == before
    trainer.train()  # its callback of ours is quiet now
    assert ci.trace(format="dict", name="step") == []


# -- 6. resuming, and checkpoints ------------------------------------------------------------------
def test_resume_from_checkpoint_goes_on_from_the_checkpoints_global_step(tmp_path):
    def trainer(**overrides):
        return Trainer(
            model=bert(),
            args=arguments(tmp_path, eval_strategy="no", num_train_epochs=3, **overrides),
            train_dataset=Tokens(16, 1, classes=3),
        )

    ci.profile(output="none")
    trainer(save_strategy="steps", save_steps=6, max_steps=6).train()
    first = finished_tree()
    # 4 steps an epoch: max_steps=6 makes it 2 epochs, whatever num_train_epochs said
    assert named(first, "train")[0]["attributes"]["num_train_epochs"] == 2.0
    (checkpoint,) = named(first, "checkpoint")
    path = checkpoint["attributes"]["path"]
    assert path.endswith("checkpoint-6")
    ci.profile(output="none")
    trainer().train(resume_from_checkpoint=path)
    resumed = finished_tree()
    assert [s["index"] for s in named(resumed, "step")] == list(range(6, 12))
    assert [e["index"] for e in named(resumed, "epoch")] == [1, 2]
    assert len(kids(named(resumed, "epoch")[0], "step")) == 2  # the rest of epoch 1


# -- 7. with plain OpenTelemetry ------------------------------------------------------------------
STANDALONE = """
    import json
    from collections import Counter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from cirron.instrumentors.torch import TorchInstrumentor
    from cirron.instrumentors.transformers import TransformersInstrumentor

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TorchInstrumentor().instrument(tracer_provider=provider)
    TransformersInstrumentor().instrument(tracer_provider=provider)

    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2))
    data = [{"input_ids": torch.randint(0, 50, (8,)), "labels": torch.tensor(i % 2)}
            for i in range(8)]
    args = TrainingArguments(output_dir="out", num_train_epochs=1, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data).train()
    TransformersInstrumentor().uninstrument()
    TorchInstrumentor().uninstrument()

    spans = exporter.get_finished_spans()
    names = {s.context.span_id: s.name for s in spans}
    print("RESULT " + json.dumps({
        "counts": Counter(s.name for s in spans),
        "parents": sorted({(s.name, names.get(s.parent.span_id) if s.parent else None)
                           for s in spans}, key=str),
    }))
"""


@pytest.mark.slow
def test_with_plain_opentelemetry_both_instrumentors_export_one_tree_to_the_users_provider(
    tmp_path,
):
    import json

    from support import run_python

    result = run_python(STANDALONE, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    found = json.loads(line.removeprefix("RESULT "))
    counts = found["counts"]
    assert (counts["train"], counts["epoch"], counts["step"]) == (1, 1, 2)
    assert counts["forward"] == counts["backward"] == counts["optimizer_step"] == 2
    parents = {tuple(pair) for pair in found["parents"]}
    assert {("forward", "step"), ("optimizer_step", "step"), ("data_load", "step")} <= parents
    assert {("step", "epoch"), ("epoch", "train"), ("train", None)} <= parents
    assert "cirron.session" not in counts
