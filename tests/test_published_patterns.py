"""Training scripts in the shapes of well-known published ones (our own code, tiny models and
synthetic data), each run in a fresh interpreter under ``ci.profile()``: the epochs, steps
and passes recorded are the ones the script's code implies, and the timeline rules hold.

The scripts are in ``tests/scripts/published/``; each docstring says what it implies.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from support import clean_environment, run_script
from timeline import check, fetches_in, steps_of
from trees import child_names, kids, named, walk

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

SCRIPTS = Path(__file__).parent / "scripts" / "published"


def traced(tmp_path: Path, script: str, *args: str, ranks: int = 1) -> list[dict]:
    """Run ``script`` profiled (under torchrun with ``ranks`` > 1); each rank's trace tree."""
    launcher = None
    if ranks > 1:
        torchrun = Path(sys.executable).with_name("torchrun")
        launcher = (str(torchrun), "--standalone", f"--nproc_per_node={ranks}")
    result = run_script(
        SCRIPTS / "traced.py", str(SCRIPTS / script), str(tmp_path), *args,
        cwd=tmp_path, timeout=300, env=clean_environment(OMP_NUM_THREADS="1"), launcher=launcher,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(ranks)]


def forwards(root: dict) -> Counter:
    """Forward spans by (mode, the name of their parent)."""
    return Counter(
        (child["attributes"]["mode"], node["name"])
        for node in walk(root)
        for child in node["children"]
        if child["name"] == "forward" and not child["attributes"].get("recompute")
    )


def test_the_ddp_tutorial_trainer_on_one_device(tmp_path):
    (root,) = traced(tmp_path, "ddp_series.py")
    check(root)
    assert [len(kids(e, "step")) for e in named(root, "epoch")] == [8, 8]
    assert all(fetches_in(s) == 1 for s in steps_of(root))


def test_the_ddp_tutorial_trainer_under_torchrun(tmp_path):
    roots = traced(tmp_path, "ddp_series.py", "--distributed", ranks=2)
    for root in roots:
        check(root)
        assert [len(kids(e, "step")) for e in named(root, "epoch")] == [8, 8]
        for forward in named(root, "forward"):
            assert forward["attributes"]["module"] == "Linear"
            assert forward["attributes"]["wrapper"] == "DistributedDataParallel"


def test_the_time_sequence_example_with_lbfgs(tmp_path):
    (root,) = traced(tmp_path, "time_sequence.py")
    check(root)
    steps = steps_of(root)
    assert len(steps) == 3
    for step in steps:
        (optimizer_step,) = kids(step, "optimizer_step")
        assert child_names(optimizer_step)["forward"] >= 1  # the closure's, inside
    # the predictions under no_grad: evaluation forwards, outside every step
    assert forwards(root)[("eval", "epoch")] == 3
    assert forwards(root)[("train", "epoch")] == 0


def test_the_mingpt_adder_trainer(tmp_path):
    (root,) = traced(tmp_path, "mingpt_adder.py")
    check(root)
    (epoch,) = named(root, "epoch")
    assert len(kids(epoch, "step")) == 30
    passes = kids(epoch, "validate")
    assert [p["attributes"]["batches"] for p in passes] == [10, 2] * 3  # train, test splits
    assert {f["attributes"]["mode"] for p in passes for f in kids(p, "forward")} == {"eval"}


def test_a_lightning_fabric_language_model(tmp_path):
    pytest.importorskip("lightning")
    (root,) = traced(tmp_path, "fabric_language_model.py")
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [6, 6]
    assert [kids(e, "validate")[0]["attributes"]["batches"] for e in epochs] == [2, 2]
    for forward in named(root, "forward"):
        assert forward["attributes"]["module"] == "LanguageModel"


def test_hf_causal_language_modelling_with_gradient_checkpointing(tmp_path):
    pytest.importorskip("transformers")
    (root,) = traced(tmp_path, "hf_causal_lm.py")
    check(root)
    epochs = named(root, "epoch")
    assert [len(kids(e, "step")) for e in epochs] == [3, 3]
    assert [len(kids(e, "validate")) for e in epochs] == [1, 1]
    assert len(named(root, "evaluate")) == 1  # trainer.evaluate() after training
    assert forwards(root)[("train", "step")] == 12  # two micro-batches a step
    recomputed = [f for f in named(root, "forward") if f["attributes"].get("recompute")]
    assert recomputed, "gradient checkpointing recomputes inside backward"
    assert all(node["status"] != "ERROR" for node in walk(root))


def test_a_subclassed_keras_model_on_the_torch_backend(tmp_path):
    pytest.importorskip("keras")
    (root,) = traced(tmp_path, "keras_subclassed_torch.py")
    check(root, optimizer=False)
    epochs = named(root, "epoch")
    assert [len(kids(e, "batch")) for e in epochs] == [8, 8]
    assert [kids(e, "validate")[0]["attributes"]["batches"] for e in epochs] == [2, 2]
    assert named(root, "step") == []  # Keras owns the batches
    assert forwards(root)[("train", "batch")] == 16
    assert forwards(root)[("train", "train")] == 0  # building the model is no training
    # Its only evaluation: the validate passes' batches. Keras builds the model by calling it
    # on the meta device (shape inference, under no_grad): no forward at all.
    evaluation = {parent: n for (mode, parent), n in forwards(root).items() if mode == "eval"}
    assert evaluation == {"validate": 4}
