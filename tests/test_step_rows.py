"""The step rows of the spool's index agree with the spans on every figure, and the commands
that read them say what reading every span says."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from opentelemetry.trace import StatusCode

from cirron.exporters import spool_reader
from cirron.offline import reading, step_table
from cirron.offline.runs import runs_of
from cirron.offline.steps import Timeline
from support import cirron, clean_environment, run_script

TORCH_LOOP = """
    import math, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import cirron as ci

    ci.profile(flush_interval=60, config={"step_resources_interval": 0})
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(96, 8), torch.randn(96, 1)), batch_size=8)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        for number, (inputs, targets) in enumerate(loader):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            ci.mark("loss", loss.item() if (epoch, number) != (2, 5) else math.nan)
            if number == 4:
                ci.flush()  # a flush between steps: rows across files
        ci.mark("epoch_loss", loss.item(), kind="summary")
"""

# Parts nested in parts, a same-name part inside its namesake, a scope between a step and its
# parts, a flush in the middle of a step, a step that fails and one with a text attribute.
NESTED = """
    import cirron as ci
    from opentelemetry import trace

    ci.profile(flush_interval=60)
    for epoch in ci.epochs(range(2)):
        for batch in ci.batches(range(6)):
            with ci.scope("data_load"):
                pass
            with ci.scope("optimizer_step"):
                with ci.scope("forward"):
                    with ci.scope("forward"):
                        pass
                with ci.scope("augment"):
                    with ci.scope("backward"):
                        ci.flush()
            ci.mark("loss", 1.0 / (batch + 1))
            if batch == 2:  # a text: only the span holds it
                trace.get_current_span().set_attribute("note", "text")
            if batch == 3:
                try:
                    with ci.scope("forward"):
                        raise ValueError("a bad batch")
                except ValueError:
                    pass
"""


def spool_of(tmp_path: Path, script: str, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(script))
    result = run_script(folder / "train.py", cwd=folder, timeout=120, env=clean_environment())
    assert result.returncode == 0, result.stderr
    return folder / ".cirron"


@pytest.fixture(scope="module")
def torch_spool(tmp_path_factory) -> Path:
    return spool_of(tmp_path_factory.mktemp("rows"), TORCH_LOOP, "torch")


@pytest.fixture(scope="module")
def nested_spool(tmp_path_factory) -> Path:
    return spool_of(tmp_path_factory.mktemp("rows"), NESTED, "nested")


def assert_rows_agree(path: Path) -> int:
    """Every step's row says what its spans say; the number of steps compared."""
    (table,) = step_table.step_tables(str(path))
    spans, problems = spool_reader.read_spans(str(path))
    assert problems == []
    timeline = Timeline(spans)
    rows = table.rows_by_id()
    assert len(rows) == len(timeline.steps) > 0
    for step in timeline.steps:
        row = rows[step.span.context.span_id]
        span = step.span
        assert table.part_times(row) == timeline.parts(step), step.number
        assert bool(table.waits[row]) == timeline.measures_waiting(step)
        assert (table.start[row], table.wall[row]) == (span.start_time, step.wall_ns)
        assert table.index[row] == (span.attributes or {}).get("index", -1)
        assert table.status[row] == span.status.status_code.value
        numbers = {
            key: value
            for key, value in (span.attributes or {}).items()
            if key != "index" and isinstance(value, (int, float))
        }
        assert {k: v[row] for k, v in table.attributes.items() if row in v} == numbers
        marks = sorted(
            (event.name, event.attributes["value"], event.timestamp) for event in span.events
        )
        held = sorted(
            (n, v, t) for n, found in table.marks.items() for r, v, t in found if r == row
        )
        assert repr(held) == repr(marks)  # (repr: NaN equals NaN)
        whole = (
            span.status.status_code is not StatusCode.ERROR
            and not span.links
            and len(numbers) == len(span.attributes or {}) - ("index" in (span.attributes or {}))
            and all(set(event.attributes) == {"value"} for event in span.events)
        )
        assert bool(table.whole[row]) == whole, step.number
    return len(timeline.steps)


def test_a_torch_loops_rows_agree_with_its_spans(torch_spool):
    assert assert_rows_agree(torch_spool) == 36


def test_nested_parts_and_a_flush_inside_a_step_agree(nested_spool):
    assert assert_rows_agree(nested_spool) == 12


def test_a_row_stands_for_its_span_only_when_it_holds_all_the_findings_read(torch_spool):
    (table,) = step_table.step_tables(str(torch_spool))
    spans, _problems = spool_reader.read_spans(str(torch_spool))
    by_id = {span.context.span_id: span for span in spans}
    standing = table.row_spans(spans[0].resource)
    assert len(standing) == len(table) == 36  # every torch step: numbers and number marks
    for proxy in standing:
        span = by_id[proxy.context.span_id]
        assert (proxy.name, proxy.start_time, proxy.end_time) == (
            span.name,
            span.start_time,
            span.end_time,
        )
        assert proxy.parent.span_id == span.parent.span_id
        assert proxy.context.trace_id == span.context.trace_id
        assert dict(proxy.attributes) == dict(span.attributes)
        assert repr([(e.name, dict(e.attributes), e.timestamp) for e in proxy.events]) == repr(
            [(e.name, dict(e.attributes), e.timestamp) for e in span.events]
        )
        assert proxy.status.status_code == span.status.status_code


def without_index(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy" / ".cirron"
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "index")
    return copy


@pytest.mark.parametrize("which", ["torch_spool", "nested_spool"])
@pytest.mark.parametrize("command", [["show", "--diagnose"], ["report", "-o", "{out}"]])
def test_the_commands_say_the_same_with_and_without_the_rows(which, command, request, tmp_path):
    path = request.getfixturevalue(which)
    said = []
    for number, spool in enumerate((path, without_index(path, tmp_path))):
        out = tmp_path / f"report-{number}.html"
        result = cirron(command[0], str(spool), *[a.format(out=out) for a in command[1:]],
                        cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
        shown = out.read_text() if command[0] == "report" else result.stdout
        said.append(shown.replace(str(spool.resolve()), "PATH"))
    assert said[0] == said[1]


def test_reading_with_rows_decodes_a_fifth_of_a_torch_loops_spans(torch_spool):
    found = reading.read_runs(str(torch_spool), lambda problem: None)
    (run,) = found
    every, _problems = spool_reader.read_spans(str(torch_spool))
    (whole,) = runs_of(every)
    assert run.span_count == len(every)
    assert len(run.spans) < len(every) / 3
    assert run.steps == whole.steps
    assert run.processes[0].table is not None


def test_a_process_with_a_file_the_index_lacks_is_read_whole(torch_spool, tmp_path):
    copy = tmp_path / ".cirron"
    shutil.copytree(torch_spool, copy)
    line = next((copy / "index").glob("*.jsonl"))
    line.write_text("".join(line.read_text().splitlines(keepends=True)[1:]))  # the first lost
    (run,) = reading.read_runs(str(copy), lambda problem: None)
    assert run.processes[0].table is None
    every, _problems = spool_reader.read_spans(str(copy))
    assert len(run.spans) == len(every)
