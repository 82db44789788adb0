"""The step timeline's rules, checked on a ``ci.trace(format="dict")`` tree (any framework).

- Consecutive steps (or Keras/``ci.batches`` batches) never overlap, nor do epochs.
- Every ``data_load`` lies inside its parent, and its parent is a step or batch, an
  evaluation pass, or an epoch (a fetch that found the loader dry, or fed no work).
- The steps add up to no more than the loop's wall time.
- No step is empty: each has training work, and an optimizer moment unless it says it
  is ``partial`` (its epoch ended first).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trees import named, walk

STEP_NAMES = ("step", "batch")
# Where a fetch may sit: the step it feeds, an evaluation pass, its epoch (the fetch that
# found the loader dry, one no work followed), or where the program was when it dropped the
# iterator after a peek (no epoch then: the session; a framework building its model: `train`).
FETCH_PARENTS = {
    "step", "batch", "validate", "evaluate", "test", "predict", "epoch", "train", "cirron.session"
}  # fmt: skip


def _short(node: dict[str, Any]) -> str:
    return f"{node['name']}[{node['index']}] {node['start_ns']}..{node['end_ns']}"


def steps_of(root: dict[str, Any]) -> list[dict[str, Any]]:
    """Every training step (or batch), in time order."""
    found = [n for n in walk(root) if n["name"] in STEP_NAMES]
    return sorted(found, key=lambda n: n["start_ns"])


def parents(root: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each span's parent node, by the child's span id."""
    found: dict[str, dict[str, Any]] = {}
    for node in walk(root):
        for child in node["children"]:
            found[child["span_id"]] = node
    return found


def check(root: dict[str, Any], wall_ns: int | None = None, optimizer: bool = True) -> None:
    """Assert the rules above (``wall_ns``: the training loop's wall time;
    ``optimizer``: steps are torch's, so each holds an ``optimizer_step``)."""
    steps = steps_of(root)
    for before, after in itertools.pairwise(steps):
        assert before["end_ns"] <= after["start_ns"], f"overlap: {_short(before)}, {_short(after)}"
    epochs = sorted(named(root, "epoch"), key=lambda n: n["start_ns"])
    for before, after in itertools.pairwise(epochs):
        assert before["end_ns"] <= after["start_ns"], f"overlap: {_short(before)}, {_short(after)}"
    above = parents(root)
    for node in walk(root):
        if node["name"] != "data_load":
            continue
        parent = above[node["span_id"]]
        where = f"{_short(node)} in {_short(parent)}"
        assert parent["name"] in FETCH_PARENTS, f"a fetch outside steps and passes: {where}"
        assert parent["start_ns"] <= node["start_ns"], f"a fetch before its parent: {where}"
        if parent["end_ns"] is not None:
            assert node["end_ns"] <= parent["end_ns"], f"a fetch after its parent: {where}"
    if wall_ns is not None:
        total = sum(s["end_ns"] - s["start_ns"] for s in steps)
        assert total <= wall_ns, f"steps add up to {total / wall_ns:.2f}x the loop"
    for step in steps:
        names = {c["name"] for c in walk(step)} - {step["name"]}
        assert names & {"forward", "backward"} or not optimizer, f"no work: {_short(step)}"
        if optimizer and step["name"] == "step" and not step["attributes"].get("partial"):
            assert "optimizer_step" in names, f"no optimizer moment: {_short(step)}"


def fetches_in(node: dict[str, Any]) -> int:
    """The ``data_load`` children of ``node``."""
    return sum(1 for child in node["children"] if child["name"] == "data_load")


def input_share(root: dict[str, Any]) -> float:
    """The share of the steps' time spent waiting for data (their ``data_load`` children)."""
    steps = steps_of(root)
    waited = sum(
        c["end_ns"] - c["start_ns"]
        for s in steps
        for c in s["children"]
        if c["name"] == "data_load"
    )
    return waited / sum(s["end_ns"] - s["start_ns"] for s in steps)


@contextmanager
def timed() -> Iterator[list[int]]:
    """``with timed() as wall:`` ... ``wall[0]`` is the block's wall time in ns."""
    wall = [0]
    start = time.time_ns()
    try:
        yield wall
    finally:
        wall[0] = time.time_ns() - start
