"""Promise 4: fork, multiprocessing and DataLoader workers: no hang, no duplicate, parent unaffected.

A child (``os.fork()``, ``multiprocessing`` with fork or spawn, a DataLoader
worker) inherits no thread and no duty of the parent's profiler: it never
exports the parent's spans, never hangs on the parent's locks, and its own
spans (if it calls ``ci.profile()``) carry its own pid, in files named for
it. The parent's trace is complete and untouched. DataLoader workers started
by fork and by spawn under the torch hooks are in ``tests/test_torch.py``
(``test_dataloader_with_two_workers_keeps_the_parents_spans``).
"""

from __future__ import annotations

import collections
import json
import signal
from pathlib import Path
from typing import Any

import pytest

import cirron as ci
from support import (
    assert_consistent,
    attribute,
    epoch_batches,
    is_error,
    named,
    run_script,
    spool_pids,
    spool_text,
    status,
    the_session,
)

SCRIPTS = Path(__file__).parent / "scripts"


def spans_of(spool: Path, pid: int) -> list[dict[str, Any]]:
    """The spans in the spool files of process ``pid``, with their resource."""
    spans = []
    for name in sorted((spool / "spool").glob(f"{pid}-*.json*")):
        request = json.loads(spool_text(name))
        for resource_spans in request["resourceSpans"]:
            resource = resource_spans["resource"]["attributes"]
            for scope_spans in resource_spans["scopeSpans"]:
                spans += [dict(span, resource=resource) for span in scope_spans["spans"]]
    return spans


def resource_pid(span: dict[str, Any]) -> int:
    (pid,) = [kv["value"]["intValue"] for kv in span["resource"] if kv["key"] == "process.pid"]
    return int(pid)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["os_exit", "sys_exit", "profile_again", "sigterm"])
def test_forked_child_neither_hangs_nor_exports_the_parents_spans(tmp_path, mode):
    spool = tmp_path / "trace"
    result = run_script(SCRIPTS / "fork_child.py", str(spool), mode, cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("DONE")
    assert "Traceback" not in result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    parent = int(lines["PID"])
    child, child_status = map(int, lines["CHILD"].split())
    assert child_status == (-signal.SIGTERM if mode == "sigterm" else 0)

    profiled_again = mode in ("profile_again", "sigterm")
    pids = spool_pids(spool)
    assert parent in pids
    assert pids - {parent} == ({child} if profiled_again else set())

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)  # no span id twice across all spool files
    parent_spans = spans_of(spool, parent)
    counts = collections.Counter(span["name"] for span in parent_spans)
    assert counts == {"before-flush": 1, "parent-work": 4, "batch": 4, "cirron.session": 1}
    assert [attribute(b, "index") for b in named(parent_spans, "batch")] == [0, 1, 2, 3]
    assert not any(is_error(span) for span in parent_spans)

    if profiled_again:
        # ci.profile() in the child starts a fresh session of its own, with the child's pid.
        child_spans = spans_of(spool, child)
        assert len(child_spans) + len(parent_spans) == len(spans)
        assert collections.Counter(s["name"] for s in child_spans) == {
            "cirron.session": 1,
            "child-session-work": 1,
        }
        assert the_session(child_spans)["traceId"] != the_session(parent_spans)["traceId"]
        assert {resource_pid(s) for s in child_spans} == {child}
        if mode == "sigterm":  # the child's own SIGTERM handling, not the parent's
            for span in child_spans:
                assert is_error(span) and "SIGTERM" in status(span)["message"], span


@pytest.mark.slow
def test_dataloader_with_forked_workers_under_ci_batches(tmp_path):
    pytest.importorskip("torch")
    spool = tmp_path / "trace"
    result = run_script(SCRIPTS / "dataloader_fork.py", str(spool), cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "SEEN 64" in result.stdout
    assert result.stdout.rstrip().endswith("DONE")
    pid = int(result.stdout.split()[1])
    assert spool_pids(spool) == {pid}, "a DataLoader worker wrote spool files"

    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)
    the_session(spans)
    by_epoch = epoch_batches(spans)
    assert sorted(by_epoch) == [0, 1]
    for batches in by_epoch.values():
        assert [attribute(b, "index") for b in batches] == list(range(8))
        for batch in batches:
            assert attribute(batch, "data_load_ns") >= 0
            assert [e["name"] for e in batch.get("events", [])].count("loss") == 1
    assert not any(is_error(span) for span in spans)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_children_export_their_own_spans_only(tmp_path, method):
    spool = tmp_path / "trace"
    result = run_script(
        SCRIPTS / "multiprocessing_children.py", str(spool), method, cwd=tmp_path, timeout=90
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("DONE")
    assert "Traceback" not in result.stderr and "cirron" not in result.stderr, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    parent = int(lines["PID"])
    children = json.loads(lines["CHILDREN"])

    # Files of the parent, of the child that profiled and of the pool workers that
    # ran a task (all of them, with fork: they end through multiprocessing's exit).
    pids = spool_pids(spool)
    assert pids == {parent, children["profiled"], *children["pool"]}, (pids, children)
    spans = ci.spool_spans(str(spool))
    assert_consistent(spans)  # no span twice, every parent present

    parent_spans = spans_of(spool, parent)
    assert collections.Counter(s["name"] for s in parent_spans) == {
        "cirron.session": 1,
        "epoch": 1,
        "batch": 3,
        "parent-work": 3,
    }
    assert not any(is_error(s) for s in parent_spans)
    assert {resource_pid(s) for s in parent_spans} == {parent}

    profiled = spans_of(spool, children["profiled"])
    assert collections.Counter(s["name"] for s in profiled) == {
        "cirron.session": 1,
        "batch": 3,
        "child-work": 3,
    }
    assert {resource_pid(s) for s in profiled} == {children["profiled"]}
    assert the_session(profiled)["traceId"] != the_session(parent_spans)["traceId"]

    pool_work = [s for pid in children["pool"] for s in spans_of(spool, pid)]
    assert len(named(pool_work, "child-work")) == 4 * 3  # four tasks of three batches
    assert len(named(pool_work, "cirron.session")) == len(children["pool"])
    for pid in children["pool"]:
        assert {resource_pid(s) for s in spans_of(spool, pid)} == {pid}
