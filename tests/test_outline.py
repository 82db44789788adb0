"""``cirron show`` of a long run prints an outline: the first and last epochs and steps, and
the steps worth a look, with a line for what is left out; ``--all`` prints every span."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

import cirron as ci
from support import cirron, clean_environment, run_script

LONG = """
    import math, time
    import cirron as ci

    ci.profile(flush_interval=60)
    for epoch in ci.epochs(range(5)):
        for batch in ci.batches(range(60)):
            with ci.scope("forward"):
                if (epoch, batch) == (2, 30):
                    time.sleep(0.05)  # a slow step in an epoch otherwise left out
            loss = math.nan if (epoch, batch) == (1, 40) else 1.0 / (batch + 1)
            ci.mark("loss", loss)
        with ci.scope("validate"):
            pass
"""


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("outline")
    (folder / "train.py").write_text(textwrap.dedent(LONG))
    result = run_script(folder / "train.py", cwd=folder, timeout=120, env=clean_environment())
    assert result.returncode == 0, result.stderr
    return folder


def test_a_long_run_prints_as_an_outline_that_accounts_for_every_step(long_run):
    shown = cirron("show", cwd=long_run)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("(a run of 300 steps, outlined")
    batches = [line.strip() for line in lines if line.strip().startswith("batch[")]
    left_out = [
        int(m[1].replace(",", ""))
        for m in re.finditer(r"\.\.\. ([\d,]+) batch(?:es)? like", shown.stdout)
    ]
    epochs_left = re.findall(r"\.\.\. ([\d,]+) epochs? like these \(([\d,]+) batch", shown.stdout)
    steps_in_left_epochs = sum(int(steps.replace(",", "")) for _n, steps in epochs_left)
    assert len(batches) + sum(left_out) + steps_in_left_epochs == 300
    epochs = [line.strip().split(" - ")[0] for line in lines if line.strip().startswith("epoch[")]
    assert epochs[0] == "epoch[0]" and epochs[-1] == "epoch[4]"
    assert "epoch[1]" in epochs and "epoch[2]" in epochs  # they hold steps worth a look
    assert "epoch[3]" not in epochs and epochs_left == [("1", "60")]
    assert any("loss=nan" in line.lower() for line in batches)  # the non-finite step
    # The slow step (50 ms) is shown, with its forward.
    slow = next(
        i for i, line in enumerate(lines) if re.search(r"batch\[30\] - [4-9]\d(\.\d+)?ms", line)
    )
    assert lines[slow + 1].strip().startswith("forward - ")
    assert sum(1 for line in lines if line.strip().startswith("validate")) == 4  # not epoch 3's


def test_all_prints_every_span(long_run):
    every = cirron("show", "--all", cwd=long_run)
    assert every.returncode == 0, every.stderr
    spans = ci.spool_spans(str(long_run / ".cirron"))
    assert len(every.stdout.splitlines()) == len(spans)


def test_a_short_run_and_filters_print_as_before(long_run):
    named = cirron("show", "--name", "epoch", cwd=long_run)
    assert named.returncode == 0 and "outlined" not in named.stdout
    assert len(named.stdout.splitlines()) == 5 * 122  # each epoch, its batches, forwards, validate
    as_json = cirron("show", "--format", "json", cwd=long_run)
    assert as_json.returncode == 0 and as_json.stdout.startswith("[")


def test_a_run_the_index_does_not_cover_prints_whole(long_run, tmp_path):
    copy = tmp_path / ".cirron"
    shutil.copytree(long_run / ".cirron", copy)
    shutil.rmtree(copy / "index")
    shown = cirron("show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "outlined" not in shown.stdout
    assert len(shown.stdout.splitlines()) == len(ci.spool_spans(str(copy)))
