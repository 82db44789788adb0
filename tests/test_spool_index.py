"""The spool's index: a line per spool file, written as the run goes, so ``cirron runs``
reads no span; and whatever becomes of the index, the listing says what the spans say."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

import cirron as ci
from cirron.exporters import spool_index, spool_reader
from cirron.offline import run_index, runs
from support import cirron, clean_environment, run_python, run_script

RUN = """
    import sys
    import cirron as ci
    ci.profile(flush_interval=60)
    for epoch in ci.epochs(range(2)):
        for batch in ci.batches(range(30)):
            with ci.scope("forward"):
                pass
            ci.mark("loss", 1.0 / (batch + 1))
        ci.flush()
    if sys.argv[-1] == "fail":
        with ci.scope("evaluate"):
            raise RuntimeError("diverged")
"""


@pytest.fixture(scope="module")
def spool(tmp_path_factory) -> Path:
    """Three runs in one folder: a plain one, two ranks of one run, and one that failed."""
    directory = tmp_path_factory.mktemp("indexed")
    script = directory / "train.py"
    script.write_text(textwrap.dedent(RUN))
    runs_made = [
        ({}, "ok"),
        ({"CIRRON_RUN_ID": "job-7", "RANK": "0", "WORLD_SIZE": "2"}, "ok"),
        ({"CIRRON_RUN_ID": "job-7", "RANK": "1", "WORLD_SIZE": "2"}, "ok"),
        ({}, "fail"),
    ]
    for environment, how in runs_made:
        result = run_script(script, how, cwd=directory, env=clean_environment(**environment))
        assert result.returncode == (1 if how == "fail" else 0), result.stderr
    return directory / ".cirron"


def figures(found: list) -> list[tuple]:
    """What ``cirron runs`` says of each run (a Run, or a run as the index lists it)."""
    return [
        (run.id, run.start_ns, run.end_ns, run.steps, run.failed, run.frameworks,
         [p.label for p in run.processes])
        for run in found
    ]  # fmt: skip


def listing(path: Path) -> list[tuple]:
    return figures(run_index.listed_runs(str(path)))


def from_spans(path: Path) -> list[tuple]:
    return figures(runs.runs_of(spool_reader.read_spans(str(path))[0]))


def test_every_spool_file_has_a_line_in_the_index(spool):
    files = {Path(name).name for name in spool_reader.spool_files(str(spool))}
    indexed = spool_index.read_index(str(spool))
    assert set(indexed) == files
    lines = [line for found in indexed.values() for line in found]
    assert sum(line["spans"] for line in lines) == len(ci.spool_spans(str(spool)))
    assert sum(line["steps"] + line["batches"] for line in lines) == 4 * 60


def test_the_index_lists_the_runs_the_spans_make(spool):
    listed = listing(spool)
    assert listed == from_spans(spool)
    assert [run[3] for run in listed] == [60, 120, 60]  # batches: the two ranks' together
    assert [run[4] for run in listed] == [False, False, True]
    assert listed[1][0] == "job-7" and listed[1][6] == ["rank 0", "rank 1"]


def copy_of(spool: Path, tmp_path: Path) -> Path:
    copy = tmp_path / ".cirron"
    shutil.copytree(spool, copy)
    return copy


@pytest.mark.parametrize(
    "damage",
    ["no index", "a line lost", "a line cut short", "garbage", "a line of another version"],
)
def test_whatever_becomes_of_the_index_the_listing_is_the_same(spool, tmp_path, damage):
    copy = copy_of(spool, tmp_path)
    first = sorted((copy / "index").iterdir())[0]
    lines = first.read_text().splitlines(keepends=True)
    if damage == "no index":
        shutil.rmtree(copy / "index")
    elif damage == "a line lost":
        first.write_text("".join(lines[1:]))
    elif damage == "a line cut short":
        first.write_text("".join(lines[:-1]) + lines[-1][:40])
    elif damage == "garbage":
        first.write_bytes(b"\x00\xff not json\n{}\n[1, 2]\n")
    else:
        first.write_text("".join(json.dumps(json.loads(line) | {"v": 99}) + "\n" for line in lines))
    assert listing(copy) == listing(spool)
    shown = cirron("runs", str(copy), cwd=tmp_path)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert shown.stdout == cirron("runs", str(spool), cwd=tmp_path).stdout


def test_the_listing_of_a_spool_folder_or_one_file(spool, tmp_path):
    assert listing(spool / "spool") == listing(spool)
    first = spool_reader.spool_files(str(spool))[0]
    (run,) = run_index.listed_runs(first)
    assert run.spans == len(spool_reader.read_file(first).spans)


def test_an_index_that_cannot_be_written_leaves_the_spool_whole(tmp_path):
    (tmp_path / ".cirron").mkdir()
    (tmp_path / ".cirron" / "index").write_text("a file where the index folder should be")
    code = textwrap.dedent(RUN) + "print('INDEX ERRORS', ci.health()['spool_index_errors'])\n"
    result = run_python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cannot write the spool's index") == 1, result.stderr
    assert "INDEX ERRORS 1" in result.stdout
    shown = cirron("runs", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert " 60  ok" in shown.stdout


def test_a_file_the_index_names_but_the_spool_lacks_is_not_listed(spool, tmp_path):
    copy = copy_of(spool, tmp_path)
    removed = spool_reader.spool_files(str(copy))[0]
    Path(removed).unlink()
    assert listing(copy) == from_spans(copy)
