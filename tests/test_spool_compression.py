"""The compact spool: gzip-compressed OTLP/JSON files by default, plain ones on request, and
every reader takes both, and what is left of a damaged file."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import subprocess
from pathlib import Path

import pytest

import cirron as ci
from cirron.exporters import spool_reader
from cirron.exporters.spool import SpoolExporter, SpoolFull
from support import cirron, run_python, spool_text

TRAIN = """
    import cirron as ci
    ci.profile(flush_interval=60)
    for epoch in ci.epochs(range(2)):
        for batch in ci.batches(range(50)):
            with ci.scope("forward"):
                pass
            ci.mark("loss", 1.0 / (batch + 1))
        ci.flush()
    ci.shutdown()
"""


@pytest.fixture(scope="module")
def compressed(tmp_path_factory) -> Path:
    """The cirron directory of a small run with the defaults: a compressed spool."""
    directory = tmp_path_factory.mktemp("compressed")
    result = run_python(TRAIN, cwd=directory)
    assert result.returncode == 0, result.stderr
    return directory / ".cirron"


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The same run with ``CIRRON_SPOOL_COMPRESSION=none``: OTLP/JSON files as before."""
    directory = tmp_path_factory.mktemp("plain")
    result = run_python(TRAIN, cwd=directory, env={"CIRRON_SPOOL_COMPRESSION": "none"})
    assert result.returncode == 0, result.stderr
    return directory / ".cirron"


def names(path: Path) -> list[str]:
    return sorted(name.name for name in (path / "spool").iterdir())


def shape(spans: list[dict]) -> list[tuple]:
    """What two runs of the same script share: each span's name, index and marks."""
    return [
        (
            span["name"],
            [a["value"] for a in span.get("attributes", []) if a["key"] == "index"],
            [(e["name"], e["attributes"]) for e in span.get("events", [])],
        )
        for span in sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))
    ]


def test_the_spool_is_gzip_compressed_otlp_json_a_span_a_line(compressed):
    files = names(compressed)
    assert len(files) == 3 and all(name.endswith(".json.gz") for name in files), files
    for name in files:
        text = gzip.decompress((compressed / "spool" / name).read_bytes()).decode("ascii")
        request = json.loads(text)  # what zcat gives is plain OTLP/JSON
        spans = [s for r in request["resourceSpans"] for ss in r["scopeSpans"] for s in ss["spans"]]
        span_lines = [line for line in text.splitlines() if line.startswith('{"traceId"')]
        assert len(span_lines) == len(spans) > 0


def test_zcat_reads_a_spool_file(compressed):
    zcat = shutil.which("zcat")
    if zcat is None:
        pytest.skip("no zcat on this machine")
    first = compressed / "spool" / names(compressed)[0]
    out = subprocess.run([zcat, str(first)], capture_output=True, check=True).stdout
    assert json.loads(out)["resourceSpans"]


def test_compression_none_writes_plain_json_files_and_both_read_the_same(compressed, plain):
    assert all(name.endswith(".json") for name in names(plain)), names(plain)
    json.loads((plain / "spool" / names(plain)[0]).read_text())  # cat-able
    assert shape(ci.spool_spans(str(compressed))) == shape(ci.spool_spans(str(plain)))
    shown = [cirron("show", str(path), cwd=path.parent) for path in (compressed, plain)]
    assert all(result.returncode == 0 for result in shown), [r.stderr for r in shown]
    strip = [[line.rsplit(" - ", 1)[0] for line in r.stdout.splitlines()] for r in shown]
    assert strip[0] == strip[1]


def test_the_compressed_spool_is_several_times_smaller(compressed, plain):
    size = {p: sum(f.stat().st_size for f in (p / "spool").iterdir()) for p in (compressed, plain)}
    assert size[compressed] * 4 < size[plain], size


HEALTH = TRAIN.replace("ci.shutdown()", "print(ci.health()['gzip'])\n    ci.shutdown()")


def without_isal(folder: Path, body: str) -> dict[str, str]:
    """An environment whose ``import isal`` finds ``body`` first (a machine without the
    ``speedups`` extra, or with a broken install of it)."""
    (folder / "isal.py").write_text(body)
    return {"PYTHONPATH": str(folder)}


@pytest.mark.parametrize(
    "isal, expected",
    [
        ("raise ImportError('not installed')", "zlib"),
        ("raise RuntimeError('a broken build')", "zlib"),
        (None, "isal"),
    ],
)
def test_isal_or_zlib_write_the_same_spool(isal, expected, compressed, tmp_path):
    """ISA-L where the ``speedups`` extra is installed, zlib where not: the same spans,
    files any gzip reader inflates, and ``ci.health()`` says which compressor ran."""
    modules = tmp_path / "modules"
    modules.mkdir()
    env = without_isal(modules, isal) if isal is not None else {}
    result = run_python(HEALTH, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [expected], result.stdout
    broken = "RuntimeError" in (isal or "")
    assert ("does not load (a broken build)" in result.stderr) == broken, result.stderr
    written = tmp_path / ".cirron"
    for name in names(written):
        json.loads(gzip.decompress((written / "spool" / name).read_bytes()))
    steps = written / "index" / next(n.name for n in (written / "index").glob("*.steps.jsonl.gz"))
    rows = [json.loads(line) for line in gzip.decompress(steps.read_bytes()).splitlines()]
    assert rows and all(row["file"] in names(written) for row in rows)
    assert shape(ci.spool_spans(str(written))) == shape(ci.spool_spans(str(compressed)))


def test_old_and_new_files_in_one_folder_read_together(compressed, plain, tmp_path):
    """A spool written before compression, then resumed by a newer cirron."""
    folder = tmp_path / ".cirron" / "spool"
    folder.mkdir(parents=True)
    for name in names(plain):
        shutil.copy(plain / "spool" / name, folder / name.replace("-", "-1", 1))
    for name in names(compressed):
        shutil.copy(compressed / "spool" / name, folder / name.replace("-", "-2", 1))
    spans = ci.spool_spans(str(tmp_path / ".cirron"))
    alone = len(ci.spool_spans(str(plain))) + len(ci.spool_spans(str(compressed)))
    assert len(spans) == alone


def damaged(source: Path, into: Path, damage) -> Path:
    """A copy of ``source``'s spool with its second file replaced by ``damage(bytes)``."""
    folder = into / ".cirron" / "spool"
    shutil.copytree(source / "spool", folder)
    second = folder / sorted(name.name for name in folder.iterdir())[1]
    second.write_bytes(damage(second.read_bytes()))
    return second


def cut(data: bytes) -> bytes:
    return data[: len(data) // 2]


def corrupt(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 8]) + data[middle + 8 :]


@pytest.mark.parametrize(
    "source, damage",
    [("compressed", cut), ("compressed", corrupt), ("plain", cut)],
    ids=["compressed, cut short", "compressed, a corrupt stream", "plain, cut short"],
)
def test_a_damaged_file_keeps_the_spans_before_the_damage_with_one_warning(
    source, damage, request, tmp_path, caplog
):
    spool = request.getfixturevalue(source)
    whole = ci.spool_spans(str(spool))
    bad = damaged(spool, tmp_path, damage)
    with caplog.at_level(logging.WARNING, logger="cirron"):
        spans = ci.spool_spans(str(tmp_path / ".cirron"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad.name in warnings[0], warnings
    assert "before the damage read" in warnings[0]
    in_bad = len(spool_reader.read_file(str(spool / "spool" / bad.name)).spans)
    lost = len(whole) - len(spans)
    assert 0 < lost < in_bad  # some of the damaged file's spans, and nothing of the others
    ids = {span["spanId"] for span in whole}
    assert {span["spanId"] for span in spans} <= ids
    # What the damaged file still gives is each span as written.
    kept = {span["spanId"]: span for span in spans}
    originals = {span["spanId"]: span for span in whole}
    assert all(kept[key] == originals[key] for key in kept)


def test_the_command_names_a_damaged_file_once_and_shows_the_rest(compressed, tmp_path):
    bad = damaged(compressed, tmp_path, cut)
    shown = cirron("show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.count(bad.name) == 1, shown.stderr
    assert "cirron.session" in shown.stdout


def test_a_file_of_gzip_garbage_is_skipped_whole(compressed, tmp_path):
    damaged(compressed, tmp_path, lambda data: gzip.compress(b"not json at all"))
    spans = ci.spool_spans(str(tmp_path / ".cirron"))
    assert len(spans) == len(ci.spool_spans(str(compressed))) - len(
        spool_reader.read_file(str(compressed / "spool" / names(compressed)[1])).spans
    )


def test_the_spool_cap_counts_compressed_bytes(compressed, tmp_path):
    spans = spool_reader.read_spans(str(compressed))[0]
    written = {}
    for compression in ("gzip", "none"):
        exporter = SpoolExporter(str(tmp_path / compression), 20_000, compression)
        for start in range(0, len(spans), 20):
            try:
                exporter.export(spans[start : start + 20])
            except SpoolFull:
                break
        folder = tmp_path / compression / "spool"
        assert sum(name.stat().st_size for name in folder.iterdir()) <= 20_000
        written[compression] = len(spool_reader.read_spans(str(folder))[0])
    assert written["gzip"] > 3 * written["none"], written


@pytest.mark.parametrize("value", ["zip", "gzip9", 3])
def test_a_bad_spool_compression_is_an_error_naming_it(value, tmp_path):
    with pytest.raises((ValueError, TypeError), match="spool_compression"):
        ci.profile(path=str(tmp_path), config={"spool_compression": value})
    with pytest.raises((ValueError, TypeError), match="spool_compression"):
        SpoolExporter(str(tmp_path), compression=value)


def test_a_bad_spool_compression_variable_warns_and_compresses(tmp_path):
    result = run_python(TRAIN, cwd=tmp_path, env={"CIRRON_SPOOL_COMPRESSION": "lz4"})
    assert result.returncode == 0, result.stderr
    assert "CIRRON_SPOOL_COMPRESSION" in result.stderr
    assert all(name.endswith(".json.gz") for name in names(tmp_path / ".cirron"))


def test_spool_text_of_both_kinds(compressed, plain):
    for path in (compressed, plain):
        first = path / "spool" / names(path)[0]
        assert json.loads(spool_text(first))["resourceSpans"]


def test_a_corrupt_stream_never_gives_a_span_that_differs_from_the_one_written(compressed):
    """Past a corruption, deflate gives garbage that may still read as JSON: wherever the
    stream is hit, what is read is what was written."""
    name = compressed / "spool" / names(compressed)[1]
    data = name.read_bytes()
    written = {span.context.span_id: span for span in spool_reader.read_file(str(name)).spans}
    for offset in range(len(data) // 5, len(data) - 20, max(1, len(data) // 40)):
        hit = (
            data[:offset] + bytes(b ^ 0x5A for b in data[offset : offset + 8]) + data[offset + 8 :]
        )
        damaged_file = name.with_name("9-000001.json.gz")
        damaged_file.write_bytes(hit)
        try:
            read = spool_reader.read_file(str(damaged_file))
        finally:
            damaged_file.unlink()
        assert read.problem is not None
        for span in read.spans:
            original = written[span.context.span_id]
            assert (span.name, span.start_time, span.end_time, span.attributes, span.parent) == (
                original.name,
                original.start_time,
                original.end_time,
                original.attributes,
                original.parent,
            ), offset
