"""The run's summary, printed by the training process on stderr when it ends.

On by default in a terminal (tmux gives the run a real one), off when stderr is a pipe or
the run writes nowhere; ``run_summary`` / ``CIRRON_RUN_SUMMARY`` decides otherwise.
"""

from __future__ import annotations

import re
import sys
import textwrap

import pytest

from support import Tmux, run_python

pytest.importorskip("torch")

# A torch loop whose loader sleeps 20 ms a batch, and a loss mark a step.
DATA_BOUND = """
import time

import torch

import cirron as ci

ci.profile({profile})
torch.set_num_threads(1)


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, index):
        time.sleep(0.02)
        return torch.randn(8), torch.randint(0, 2, ()).long()


model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for inputs, labels in torch.utils.data.DataLoader(Slow(), batch_size=1):
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ci.mark("loss", loss.item())
print("TRAINED")
"""


def data_bound(profile: str = "") -> str:
    return DATA_BOUND.format(profile=profile)


def test_it_is_off_when_stderr_is_not_a_terminal():
    result = run_python(data_bound())
    assert result.returncode == 0, result.stderr
    assert "run summary" not in result.stderr


def test_the_setting_turns_it_on_and_its_figures_are_those_of_the_run():
    result = run_python(data_bound(), env={"CIRRON_RUN_SUMMARY": "true"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("[cirron]")]
    assert lines[0].startswith("[cirron] run summary: 40 steps in ")
    median = re.search(r"step ([\d.]+)ms median", lines[0])
    assert median and 20 <= float(median[1]) <= 60, lines[0]
    assert lines[1].startswith("[cirron]   last marks: loss ")
    data = re.search(r"step time by part: data ([\d.]+)ms \((\d+)%\)", result.stderr)
    assert data and 20 <= float(data[1]) <= 60 and int(data[2]) >= 80, result.stderr
    assert "the run is input-bound." in result.stderr
    assert "next: feed the loop faster" in result.stderr
    assert lines[-1] == "[cirron]   the spool: .cirron · more: cirron show .cirron --diagnose"


def test_config_turns_it_off():
    result = run_python(data_bound('config={"run_summary": False}'),
                        env={"CIRRON_RUN_SUMMARY": "true"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "run summary" not in result.stderr


def test_a_mark_that_became_nan_is_its_first_finding():
    result = run_python(
        """
        import math
        import cirron as ci

        ci.profile(output="none", config={"run_summary": True})
        for step in ci.batches(range(20)):
            ci.mark("loss", math.nan if step >= 15 else 1.0 / (step + 1))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "[cirron]   error: loss was not finite (NaN or inf) 5 times." in result.stderr
    assert "the spool" not in result.stderr  # output="none": nothing written to read more in


def test_a_bad_value_of_the_variable_warns_and_falls_back():
    result = run_python(data_bound(), env={"CIRRON_RUN_SUMMARY": "sometimes"})
    assert result.returncode == 0
    assert "CIRRON_RUN_SUMMARY" in result.stderr
    assert "run summary" not in result.stderr  # the default: stderr is a pipe here


def test_its_thresholds_are_those_of_diagnose():
    from cirron.metrics import run_summary
    from cirron.offline import step_findings

    assert run_summary.INPUT_BOUND == step_findings.INPUT_BOUND
    assert run_summary.SLOW_FACTOR == step_findings.SLOW_FACTOR


@pytest.mark.slow
def test_in_a_terminal_it_is_on_unless_the_run_writes_nowhere(tmp_path):
    (tmp_path / "train.py").write_text(data_bound())
    (tmp_path / "quiet.py").write_text(data_bound('output="none"'))
    with Tmux(tmp_path) as tmux:
        pane = tmux.panes[0]
        tmux.type(pane, f"{sys.executable} quiet.py; echo QUIET-DONE")
        screen = tmux.wait_for(pane, lambda s: re.search(r"^QUIET-DONE", s, re.M), 120)
        assert "TRAINED" in screen and "run summary" not in screen
        tmux.type(pane, "clear")
        tmux.type(pane, f"{sys.executable} train.py; echo TRAIN-DONE")
        screen = tmux.wait_for(pane, lambda s: re.search(r"^TRAIN-DONE", s, re.M), 120)
    summary = screen[screen.index("[cirron] run summary") :]
    assert textwrap.dedent(summary).count("[cirron]") >= 4
    assert "40 steps" in summary and "input-bound" in summary
