"""Many ranks: ``collective`` spans from DDP's all-reduce, and the straggler view
(``cirron show --ranks``, its finding in ``--diagnose``), on real torchrun runs.

Each run is tests/scripts/ddp_ranks.py under ``torchrun --nproc_per_node=3`` on gloo, with one
rank made slow (its DataLoader sleeps, or its forward computes longer): the finding must name
that rank and that part, and the other ranks' collective spans must hold the wait.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import cirron as ci
import support
from support import clean_environment

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
BIN = Path(sys.executable).parent
SCRIPT = Path(__file__).parent / "scripts" / "ddp_ranks.py"
KNOWN_RUN = Path(__file__).parent / "scripts" / "known_run.py"
SLOW_MS = 40


def torchrun(path: Path, *flags: str, ranks: int = 3) -> None:
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={ranks}", str(SCRIPT),
         str(path), *flags],
        env=clean_environment(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def cirron(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return support.cirron(*arguments, cwd=directory, timeout=120)


@pytest.fixture(scope="module")
def slow_loader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose rank 2's DataLoader sleeps 40 ms a batch, its weights dumped."""
    path = tmp_path_factory.mktemp("slow-loader")
    torchrun(path / "out", "--slow-rank", "2", "--slow-in", "data", "--slow-ms", str(SLOW_MS),
             "--dump", str(path / "profiled"))  # fmt: skip
    return path


def buckets_by_rank(path: Path) -> dict[int, list[dict]]:
    """The collective spans of DDP's buckets, by rank (the script's last barrier left out)."""
    found: dict[int, list[dict]] = {}
    for span in ci.spool_spans(str(path)):
        resource = {a["key"]: a["value"] for a in span["resource"]}
        if span["name"] == "collective" and attribute(span, "collective.op") != "barrier":
            rank = int(resource["cirron.rank"]["intValue"])
            found.setdefault(rank, []).append(span)
    return found


def duration_ms(span: dict) -> float:
    return (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6


def attribute(span: dict, key: str) -> object:
    value = next(a["value"] for a in span["attributes"] if a["key"] == key)
    return next(iter(value.values()))


def test_the_rank_whose_loader_sleeps_is_named_with_data_wait(slow_loader):
    output = cirron(slow_loader, "show", "--diagnose", "out").stdout
    (finding,) = re.findall(r"^warning +(rank 2 was the slowest in .*)$", output, re.M)
    share = int(re.search(r"slowest in (\d+)%", finding).group(1))
    assert share >= 80, finding
    assert "in data wait" in finding
    assert "the other ranks spent that time waiting in all-reduce" in finding
    assert 30 <= gap_ms(finding) <= 60, finding  # it sleeps 40 ms a batch


def gap_ms(finding: str) -> float:
    return float(re.search(r"\+([\d.]+)ms at the median", finding).group(1))


def test_the_other_ranks_collective_spans_hold_the_wait(slow_loader):
    by_rank = buckets_by_rank(slow_loader / "out")
    assert sorted(by_rank) == [0, 1, 2]
    for spans in by_rank.values():
        assert len(spans) == 10  # one bucket a step: a small model
        for span in spans:
            assert attribute(span, "collective.op") == "all_reduce"
            assert attribute(span, "collective.bucket") == "0"
            assert attribute(span, "collective.group_size") == "3"
            assert attribute(span, "collective.backend") == "gloo"
            assert int(attribute(span, "collective.bytes")) == 4 * (32 * 64 + 64 + 64 * 4 + 4)
    waited = {rank: statistics.median(map(duration_ms, spans)) for rank, spans in by_rank.items()}
    assert waited[0] > SLOW_MS / 2 and waited[1] > SLOW_MS / 2, waited
    # The slow rank's own all-reduce is short, but not nothing: three ranks share two cores
    # (10 ms on a busy machine); the others waited several times longer for it.
    assert waited[2] < SLOW_MS / 2 and 3 * waited[2] < min(waited[0], waited[1]), waited


def test_collective_spans_are_children_of_their_backward_or_of_where_they_were_called(
    slow_loader,
):
    spans = ci.spool_spans(str(slow_loader / "out"))
    names = {span["spanId"]: span["name"] for span in spans}
    parents = {
        attribute(s, "collective.op"): names.get(s["parentSpanId"])
        for s in spans
        if s["name"] == "collective"
    }
    assert parents["all_reduce"] == "backward"
    assert parents["barrier"] in ("epoch", "cirron.session")  # after the loop: no step


def test_ddp_gradients_and_losses_are_bit_identical_without_cirron(slow_loader, tmp_path):
    torchrun(tmp_path / "out", "--no-profile", "--dump", str(tmp_path / "bare"))
    for rank in range(3):
        profiled = json.loads((slow_loader / f"profiled.{rank}.json").read_text())
        bare = json.loads((tmp_path / f"bare.{rank}.json").read_text())
        assert profiled == bare, f"rank {rank} differs"


def test_show_ranks_prints_a_row_per_rank_with_the_slowest_counted(slow_loader):
    result = cirron(slow_loader, "show", "--ranks", "out")
    assert result.returncode == 0, result.stderr
    rows = {
        line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("rank ")
    }
    assert sorted(rows) == ["0", "1", "2"]
    slowest = {rank: int(re.search(r"(\d+) of 10$", line).group(1)) for rank, line in rows.items()}
    assert slowest["2"] >= 8, result.stdout


def test_a_rank_whose_forward_is_slow_is_named_with_forward(tmp_path):
    torchrun(tmp_path / "out", "--slow-rank", "1", "--slow-in", "forward", "--slow-ms", "40")
    output = cirron(tmp_path, "show", "--diagnose", "out").stdout
    (finding,) = re.findall(r"^warning +(rank 1 was the slowest in .*)$", output, re.M)
    assert "in forward" in finding
    assert "waiting in all-reduce" in finding


def test_of_two_ranks_the_gap_said_is_the_whole_gap(tmp_path):
    torchrun(tmp_path / "out", "--slow-rank", "1", "--slow-in", "forward", "--slow-ms", "40",
             ranks=2)  # fmt: skip
    output = cirron(tmp_path, "show", "--diagnose", "out").stdout
    (finding,) = re.findall(r"^warning +(rank 1 was the slowest in .*)$", output, re.M)
    assert 30 <= gap_ms(finding) <= 60, finding  # not half of it (the median of two is the mean)


# -- bad input: a clear line, never a traceback --------------------------------------------
def known_run(directory: Path, *flags: str, **environment: str) -> None:
    result = subprocess.run(
        [str(BIN / "python"), str(KNOWN_RUN), "--compute-ms", "0.5", *flags], cwd=directory,
        env=clean_environment(**environment), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


def test_ranks_with_different_step_counts_are_compared_over_the_steps_they_share(tmp_path):
    known_run(tmp_path, "--steps", "10", RANK="0", CIRRON_RUN_ID="crashed")
    known_run(tmp_path, "--steps", "6", RANK="1", CIRRON_RUN_ID="crashed")
    shown = cirron(tmp_path, "show", "--ranks")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr
    assert "(rank 1: 6; the others: 10)" in shown.stdout
    assert "compared over the first 6 steps" in shown.stdout
    diagnosed = cirron(tmp_path, "show", "--diagnose")
    assert "different numbers of steps" in diagnosed.stdout


def test_a_spool_with_one_rank_says_there_is_nothing_to_line_up(tmp_path):
    known_run(tmp_path, "--steps", "5")
    shown = cirron(tmp_path, "show", "--ranks")
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    assert shown.stderr.startswith("cirron: ") and "one process" in shown.stderr
    assert "slowest" not in cirron(tmp_path, "show", "--diagnose").stdout


FSDP = """
import json, os, sys, torch, torch.distributed as dist
import cirron as ci
from torch.distributed.fsdp import fully_shard

ci.profile(output="none", frameworks=["torch"])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    optimizer.step()


def walk(node, parent, found):
    if node["name"] == "collective":
        found.append([parent, node["attributes"]["collective.op"]])
    for child in node["children"]:
        walk(child, node["name"], found)
    return found


if dist.get_rank() == 0:
    found = walk(ci.trace(format="dict"), None, [])
    with open(sys.argv[1], "w") as out:
        json.dump({"collectives": found, "hook_errors": ci.health()["hook_errors"]}, out)
dist.destroy_process_group()
"""


def test_fsdp2_all_gathers_and_reduce_scatters_are_collective_spans(tmp_path):
    script, out = tmp_path / "fsdp.py", tmp_path / "found.json"
    script.write_text(FSDP)
    result = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", str(script), str(out)],
        env=clean_environment(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["hook_errors"] == 0
    pairs = {tuple(pair) for pair in found["collectives"]}
    # Each step: a layer's parameters gathered for its forward and again for its backward,
    # its gradients reduce-scattered in the backward.
    assert pairs == {("forward", "all_gather_single"), ("backward", "all_gather_single"),
                     ("backward", "reduce_scatter_single")}  # fmt: skip
    assert len(found["collectives"]) == 2 * 6
