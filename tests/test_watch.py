"""``cirron watch``: a live view of a run from another terminal, driven as a user drives it.

tmux runs the training in one pane and ``cirron watch`` in another; what the watch pane shows
is read with ``capture-pane``. The figures are checked against runs whose answer is known: a
loader that sleeps 20 ms a batch (input-bound), a rank slowed in its optimizer step.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import Tmux, cirron, clean_environment, run_script

pytest.importorskip("torch")
BIN = Path(sys.executable).parent
CIRRON = str(BIN / "cirron")
SLEEP_MS = 20

# A loop whose loader sleeps SLEEP_MS a batch: its steps wait for data nearly all the time.
DATA_BOUND = f"""
import sys
import time

import torch

import cirron as ci

ci.profile()
torch.manual_seed(0)
torch.set_num_threads(1)


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        time.sleep({SLEEP_MS} / 1000)
        return torch.randn(16), torch.randint(0, 4, ()).long()


model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(sys.argv[1])
for number, (inputs, labels) in enumerate(torch.utils.data.DataLoader(Slow(), batch_size=1)):
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ci.mark("loss", loss.item())
    if number + 1 == steps:
        break
"""


@pytest.fixture
def data_bound(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(DATA_BOUND)
    return script


def exit_status(screen: str) -> int | None:
    """The status the command typed as ``...; echo WATCH-EXIT=$?`` exited with, once it has."""
    found = re.search(r"^WATCH-EXIT=(\d+)", screen, re.MULTILINE)
    return int(found[1]) if found else None


def exited(screen: str) -> bool:
    return exit_status(screen) is not None


def steps_shown(screen: str) -> int:
    found = re.search(r"([\d,]+) steps", screen)
    return int(found[1].replace(",", "")) if found else -1


@pytest.mark.slow
def test_watch_in_a_terminal_shows_the_steps_rise_the_input_bound_finding_and_the_summary(
    tmp_path, data_bound
):
    with Tmux(tmp_path) as tmux:
        training, watching = tmux.panes[0], tmux.split()
        tmux.type(watching, f"{CIRRON} watch; echo WATCH-EXIT=$?")
        tmux.wait_for(watching, "waiting for a run in .cirron")
        tmux.type(training, f"{sys.executable} {data_bound} 500")
        first = steps_shown(tmux.wait_for(watching, lambda s: steps_shown(s) > 0))
        later = steps_shown(tmux.wait_for(watching, lambda s: steps_shown(s) > first + 20))
        assert later > first
        screen = tmux.wait_for(watching, "waiting for data")
        assert "input-bound" in screen and "next: feed the loop faster" in screen
        assert "loss" in screen
        screen = tmux.wait_for(watching, exited, timeout=120)
        assert exit_status(screen) == 0
        assert "the run ended." in screen
        assert "500 steps" in screen and "step time by part: data" in screen
        assert "cirron show .cirron --diagnose" in screen


@pytest.mark.slow
def test_ctrl_c_stops_watching_cleanly(tmp_path):
    with Tmux(tmp_path) as tmux:
        pane = tmux.panes[0]
        tmux.type(pane, f"{CIRRON} watch; echo WATCH-EXIT=$?")
        tmux.wait_for(pane, "waiting for a run")
        tmux.keys(pane, "C-c")
        screen = tmux.wait_for(pane, exited)
        assert exit_status(screen) == 0
        assert "stopped watching (the run goes on)" in screen
        assert "Traceback" not in screen


@pytest.mark.slow
def test_a_window_too_small_for_the_view_still_shows_its_top(tmp_path, data_bound):
    with Tmux(tmp_path, width=50, height=14) as tmux:
        training, watching = tmux.panes[0], tmux.split()
        tmux.type(training, f"{sys.executable} {data_bound} 150")
        tmux.type(watching, f"{CIRRON} watch; echo WATCH-EXIT=$?")
        tmux.wait_for(watching, lambda s: steps_shown(s) > 0)
        screen = tmux.wait_for(watching, exited, timeout=120)
        assert exit_status(screen) == 0 and "Traceback" not in screen


def test_without_a_terminal_it_waits_then_prints_a_line_a_refresh_and_the_summary(
    tmp_path, data_bound
):
    watch = subprocess.Popen(
        [CIRRON, "watch", "--interval", "0.5"], cwd=tmp_path, env=clean_environment(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1.5)
        training = run_script(data_bound, "120", cwd=tmp_path, timeout=120)
        assert training.returncode == 0, training.stderr
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "waiting for a run in .cirron ..."
    refreshes = [line for line in lines if " running · " in line]
    assert refreshes, out
    assert "\x1b[" not in out  # plain text: no escape codes
    summary = out[out.index("the run ended.") :]
    assert "120 steps" in summary and "warning  " in summary


def test_the_figures_of_a_loader_sleeping_20ms_a_batch(tmp_path, data_bound):
    training = run_script(data_bound, "100", cwd=tmp_path, timeout=120)
    assert training.returncode == 0, training.stderr
    shown = cirron("watch", "--run", "-1", "--plain", cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    median = re.search(r"step ([\d.]+)ms median", shown.stdout)
    share = re.search(r"input-bound (\d+)%", shown.stdout)
    data = re.search(r"step time by part: data ([\d.]+)ms \((\d+)%\)", shown.stdout)
    assert median and share and data, shown.stdout
    assert SLEEP_MS <= float(median[1]) <= 3 * SLEEP_MS
    assert int(share[1]) >= 80  # 20 ms of sleep in a step of well under 25 ms on its own
    assert SLEEP_MS <= float(data[1]) <= 3 * SLEEP_MS
    assert "100 steps" in shown.stdout and "the run ended." in shown.stdout
    assert "is spent waiting for data" in shown.stdout


def test_once_prints_the_run_as_it_is_and_a_folder_without_one_says_so(tmp_path, data_bound):
    empty = cirron("watch", "--once", cwd=tmp_path)
    assert empty.returncode == 1 and "no run in .cirron yet" in empty.stderr
    assert run_script(data_bound, "30", cwd=tmp_path, timeout=120).returncode == 0
    shown = cirron("watch", "--once", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "30 steps" in shown.stdout and "ended" in shown.stdout


def test_a_run_that_ended_before_watch_began_is_not_watched_again(tmp_path, data_bound):
    assert run_script(data_bound, "10", cwd=tmp_path, timeout=120).returncode == 0
    watch = subprocess.Popen(
        [CIRRON, "watch"], cwd=tmp_path, env=clean_environment(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(3)
        assert watch.poll() is None  # still waiting, for the next run
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=30)
    finally:
        watch.kill()
    assert watch.returncode == 0
    assert "waiting for a run in .cirron ... (the latest" in out
    assert "`cirron watch --run -1` shows it" in out
    assert "stopped watching" in err


def test_watch_started_before_its_named_run_waits_for_it(tmp_path, data_bound):
    watch = subprocess.Popen(
        [CIRRON, "watch", "--run", "exp42", "--interval", "0.5"], cwd=tmp_path,
        env=clean_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(2)
        assert watch.poll() is None  # waiting, not refused
        trained = run_script(
            data_bound, "20", cwd=tmp_path, timeout=120,
            env=clean_environment(CIRRON_RUN_ID="exp42"),
        )  # fmt: skip
        assert trained.returncode == 0, trained.stderr
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "waiting for run 'exp42' in .cirron ... (the runs there: none yet)" in out
    assert "the run ended" in out and "20 steps" in out, out


def test_a_run_that_crashed_is_said_to_have(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import time

            import cirron as ci

            ci.profile()
            for step in ci.batches(range(10_000)):
                time.sleep(0.01)
                if step == 150:
                    os._exit(3)  # as if killed: no exit handler, the session never ends
            """
        )
    )
    watch = subprocess.Popen(
        [CIRRON, "watch", "--interval", "0.5"], cwd=tmp_path, env=clean_environment(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert run_script(script, cwd=tmp_path, timeout=60).returncode == 3
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "the run crashed: its process ended without closing the run." in out


def test_watch_follows_one_run_and_a_spool_file_is_no_folder(tmp_path, data_bound):
    refused = cirron("watch", "--run", "all", cwd=tmp_path)
    assert refused.returncode == 2 and "--run all: watch follows one run" in refused.stderr
    assert run_script(data_bound, "5", cwd=tmp_path, timeout=120).returncode == 0
    spool_file = sorted((tmp_path / ".cirron" / "spool").iterdir())[0]
    refused = cirron("watch", str(spool_file), cwd=tmp_path)
    assert refused.returncode == 2 and "is a file: watch a cirron directory" in refused.stderr
    unknown = cirron("watch", "--run", "7", cwd=tmp_path)  # a run's number: not there
    assert unknown.returncode == 2 and "names no run" in unknown.stderr
    once = cirron("watch", "--run", "exp42", "--once", cwd=tmp_path)  # --once never waits
    assert once.returncode == 2 and "names no run" in once.stderr


@pytest.mark.parametrize("interval", ["0", "-1", "99999"])
def test_a_bad_interval_is_refused_before_any_work(tmp_path, interval):
    refused = cirron("watch", "--interval", interval, cwd=tmp_path)
    assert refused.returncode == 2
    assert "--interval must be seconds" in refused.stderr


@pytest.mark.slow
def test_two_ranks_under_torchrun_show_a_line_each_and_name_the_rank_slow_in_its_optimizer(
    tmp_path,
):
    script = Path(__file__).parent / "scripts" / "ddp_ranks.py"
    command = (
        f"OMP_NUM_THREADS=1 {BIN / 'torchrun'} --standalone --nproc_per_node=2 {script} "
        f"{tmp_path / 'out'} --steps 400 --slow-rank 1 --slow-in optimizer --slow-ms 30"
    )
    with Tmux(tmp_path, height=70) as tmux:
        training, watching = tmux.panes[0], tmux.split()
        tmux.type(watching, f"{CIRRON} watch out; echo WATCH-EXIT=$?")
        tmux.type(training, command)
        screen = tmux.wait_for(watching, "slowest: rank 1", timeout=120)
        assert re.search(r"rank 0 +[\d,]+ ", screen) and re.search(r"rank 1 +[\d,]+ ", screen)
        assert "optimizer_step" in screen.split("slowest: rank 1")[1].splitlines()[0]
        screen = tmux.wait_for(watching, exited, timeout=180)
        assert exit_status(screen) == 0 and "slowest rank: rank 1" in screen


def test_the_follower_reads_only_what_was_appended_and_keeps_the_recent_steps(tmp_path):
    from cirron.offline import live

    script = tmp_path / "steps.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import time

            import cirron as ci

            ci.profile(flush_interval=0.05)
            for step in ci.batches(range(int(sys.argv[1]))):
                ci.mark("loss", 1.0 / (step + 1))
                if step % 50 == 0:
                    time.sleep(0.06)  # a flush every 50 steps or so: many small files
            """
        )
    )
    assert run_script(script, "3000", cwd=tmp_path, timeout=120).returncode == 0
    follower = live.IndexFollower(str(tmp_path / ".cirron"))
    assert follower.poll() is True
    assert follower.poll() is False  # nothing appended since: nothing read again
    ((process),) = follower.processes.values()
    assert process.step_count == 3000 and process.ended
    assert len(process.recent) < 20  # the flushes of the last WINDOW steps, not all of them
    assert live.WINDOW <= process.recent_rows < live.WINDOW + 200
    assert len(process.marks["loss"]) == live.HISTORY
    assert process.marks["loss"][-1] == 1.0 / 3000
    files = len(list((tmp_path / ".cirron" / "spool").iterdir()))
    assert files > 20  # (the run did write many files)
    assert run_script(script, "100", cwd=tmp_path, timeout=120).returncode == 0
    assert follower.poll() is True  # a second run appended: only that is read
    assert [run.steps for run in follower.runs()] == [3000, 100]


def test_a_sparkline_draws_the_lowest_to_the_highest_a_flat_series_flat_and_nan_as_a_mark():
    from cirron.offline.live_view import sparkline

    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0.05] * 90) == "▁" * 30  # 90 values in 30 buckets, their means equal
    assert sparkline([1.0, float("nan"), 3.0]) == "▁!█"
    assert sparkline([]) == ""
