"""The questions about steps (``show --diagnose``, ``report``, ...) read a long run's spool
files in worker processes: the answers are those of reading it all in one process."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from cirron.offline import findings, reading

pytestmark = pytest.mark.slow


def _answers(path: Path) -> list[Any]:
    problems: list[Any] = []
    runs = reading.read_runs(str(path), problems.append)
    assert problems == []
    return [
        (
            run.id,
            [(p.label, len(p.spans), p.passed_over) for p in run.processes],
            sorted((s.name, s.context.span_id) for s in run.spans),
            [(f.severity, f.text, f.span_ids) for f in findings.diagnose(run)],
        )
        for run in runs
    ]


def test_a_long_run_read_in_workers_gives_the_answers_of_one_process(tmp_path, monkeypatch):
    from benchmarks.long_runs import write_spool

    write_spool(tmp_path / ".cirron", 5000)  # three spool files and their index
    in_workers = _answers(tmp_path / ".cirron")
    assert multiprocessing.active_children() == []

    def refused(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.ForkContext, "Pool", refused)
    alone = _answers(tmp_path / ".cirron")
    assert in_workers == alone
    ((run_id, processes, spans, found),) = alone
    assert processes[0][2] == 5000 * 4  # the parts of every step passed over: their rows read
    assert found  # the synthetic run's slow steps
