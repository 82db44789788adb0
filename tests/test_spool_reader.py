"""Reading a spool that holds bad files: every ``cirron`` command and the Python readers keep
every good span, and name each bad file once with the reason.

Each bad file sits next to a good one (the spool file of a real profiled run). These spools
are made outside pytest's ``tmp_path``: the suite's check that no span id is spooled twice
reads every spool under it, and these hold broken files on purpose.
"""

from __future__ import annotations

import base64
import collections
import copy
import gc
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cirron as ci
from support import cirron, run_python, spool_text

BIN = Path(sys.executable).parent
GOOD = "100-000001.json"
BAD = "200-000001.json"

TRAIN = """
    import cirron as ci
    ci.profile(flush_interval=60)
    for epoch in ci.epochs(range(2)):
        for batch in ci.batches(range(3)):
            with ci.scope("forward"):
                pass
            ci.mark("loss", 1.0 / (batch + 1))
    ci.shutdown()
"""


@pytest.fixture(scope="module")
def good_file(tmp_path_factory) -> Path:
    """The one spool file of a small profiled run."""
    directory = tmp_path_factory.mktemp("good")
    result = run_python(TRAIN, cwd=directory)
    assert result.returncode == 0, result.stderr
    (name,) = (directory / ".cirron" / "spool").iterdir()
    return name


@pytest.fixture(scope="module")
def good(good_file) -> dict[str, Any]:
    return json.loads(spool_text(good_file))


def new_spool(good_file: Path) -> tempfile.TemporaryDirectory[str]:
    directory = tempfile.TemporaryDirectory(prefix="cirron-spool-")
    folder = Path(directory.name) / ".cirron" / "spool"
    folder.mkdir(parents=True)
    shutil.copy(good_file, folder / GOOD)
    return directory


@pytest.fixture
def spool(good_file) -> Iterator[Path]:
    """A cirron directory whose spool holds the good file."""
    with new_spool(good_file) as directory:
        yield Path(directory) / ".cirron"


def spans_of(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        span
        for resource_spans in request["resourceSpans"]
        for scope_spans in resource_spans["scopeSpans"]
        for span in scope_spans["spans"]
    ]


def ids(spans: list[Any]) -> collections.Counter[tuple[str, str]]:
    """(trace id, span id) of span dicts or SDK spans, each counted."""
    return collections.Counter(
        (s["traceId"], s["spanId"])
        if isinstance(s, dict)
        else (format(s.context.trace_id, "032x"), format(s.context.span_id, "016x"))
        for s in spans
    )


def with_span(good: dict[str, Any], span_id: str = "abcdef0123456789", **fields: Any) -> bytes:
    """A request of the good run's process holding one more span, a child of its session,
    with ``fields`` set."""
    (session,) = [s for s in spans_of(good) if s["name"] == "cirron.session"]
    start = int(session["startTimeUnixNano"]) + 1
    span = {
        "traceId": session["traceId"], "spanId": span_id, "parentSpanId": session["spanId"],
        "name": "extra", "kind": 1, "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 1000), "attributes": [],
    } | fields  # fmt: skip
    request = {
        "resourceSpans": [
            {"resource": good["resourceSpans"][0]["resource"],
             "scopeSpans": [{"scope": {"name": "cirron"}, "spans": [span]}]}
        ]
    }  # fmt: skip
    return json.dumps(request).encode("ascii")  # a lone surrogate is written as "\ud800"


# What a user found, each next to a good file: (content, words of the reason, names of the
# spans it adds to the good file's).
CASES = {
    "resourceSpans holds a number": lambda good: (b'{"resourceSpans":[1]}', "resourceSpans[0]", []),
    "2,000 nested lists": lambda good: (b"[" * 2000, "nested too deeply", []),
    "a span named 5": lambda good: (with_span(good, name=5), "name", []),
    "a lone surrogate in a name": lambda good: (
        with_span(good, name="bad\ud800name"),
        "U+FFFD",
        ["bad\ufffdname"],
    ),
    "bytes that are not UTF-8": lambda good: (b'{"resourceSpans": ["\xff"]}', "UTF-8", []),
}


def named_once(stderr: str, file: str, reason: str) -> None:
    lines = [line for line in stderr.splitlines() if file in line]
    assert len(lines) == 1 and reason in lines[0], stderr


@pytest.fixture(scope="module")
def shown_alone(good_file) -> list[str]:
    """``cirron show`` of the good file on its own."""
    with new_spool(good_file) as directory:
        shown = cirron("show", cwd=Path(directory))
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    return shown.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_command_names_a_bad_file_once_and_keeps_every_good_span(
    case, spool, good, shown_alone
):
    content, reason, added = CASES[case](good)
    (spool / "spool" / BAD).write_bytes(content)

    shown = cirron("show", str(spool), cwd=spool.parent)
    assert shown.returncode == 0, shown.stderr
    named_once(shown.stderr, BAD, reason)
    lines = shown.stdout.splitlines()
    assert collections.Counter(shown_alone) <= collections.Counter(lines)
    assert len(lines) == len(shown_alone) + len(added)
    assert all(any(name in line for line in lines) for name in added)

    listed = cirron("runs", str(spool), cwd=spool.parent)
    assert listed.returncode == 0, listed.stderr
    named_once(listed.stderr, BAD, reason)
    assert len(listed.stdout.splitlines()) == 2  # the heading and the one run

    report = cirron("report", str(spool), "-o", str(spool / "report.html"), cwd=spool.parent)
    assert report.returncode == 0, report.stderr
    named_once(report.stderr, BAD, reason)
    assert (spool / "report.html").stat().st_size > 1000

    trace = spool / "trace.json"
    exported = cirron("export", str(spool), "--format", "chrome", "-o", str(trace),
                      cwd=spool.parent)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    named_once(exported.stderr, BAD, reason)
    slices = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(spans_of(good)) + len(added)


@pytest.mark.parametrize("case", [case for case in CASES if "surrogate" not in case])
def test_spool_spans_warns_once_about_a_bad_file_and_keeps_every_good_span(
    case, spool, good, caplog
):
    content, reason, added = CASES[case](good)
    (spool / "spool" / BAD).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="cirron"):
        spans = ci.spool_spans(str(spool))
        requests = ci.read_spool(str(spool))
    assert ids(spans) - ids(spans_of(good)) == collections.Counter(
        ids([s for s in spans if s["name"] in added])
    )
    assert ids(spans_of(good)) <= ids(spans)
    assert sorted(s["name"] for s in spans if s["name"] in added) == added
    assert ids([s for request in requests for s in spans_of(request)]) == ids(spans)
    warnings = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert len(warnings) == 2  # one per call
    assert all(BAD in warning and reason in warning for warning in warnings), warnings


def test_iter_spool_spans_reads_a_file_when_the_loop_gets_to_it(spool, good, caplog):
    """What ``spool_spans`` returns, one file at a time: a bad file is named when the loop
    reaches it, and a missing folder is an error at the call."""
    (spool / "spool" / BAD).write_bytes(b"{not json")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        spans = ci.iter_spool_spans(str(spool))
        assert not [r for r in caplog.records if r.name == "cirron"]  # nothing read yet
        assert ids(list(spans)) == ids(spans_of(good))
        assert [r for r in caplog.records if BAD in r.getMessage()]
        assert [ids(spans_of(r)) for r in ci.iter_spool(str(spool))] == [ids(spans_of(good))]
    with pytest.raises(TypeError, match="path"):
        ci.iter_spool_spans(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("collector_on", [True, False])
def test_reading_a_spool_leaves_the_garbage_collector_as_it_found_it(spool, collector_on):
    """The reader pauses Python's cycle collector while it parses a file (none of what a file
    holds is in a cycle); after it, a bad file included, the collector is as the program set it."""
    (spool / "spool" / BAD).write_bytes(b"{not json")
    was = gc.isenabled()
    (gc.enable if collector_on else gc.disable)()
    try:
        spans = ci.spool_spans(str(spool))
        requests = ci.read_spool(str(spool))
        assert gc.isenabled() is collector_on
    finally:
        (gc.enable if was else gc.disable)()
    assert spans and len(requests) == 1  # the good file's; the bad one is named and left out


def test_spool_spans_gives_a_lone_surrogate_as_written_and_the_reader_repairs_it(
    spool, good, caplog
):
    (spool / "spool" / BAD).write_bytes(with_span(good, name="bad\ud800name"))
    with caplog.at_level(logging.WARNING, logger="cirron"):
        spans = ci.spool_spans(str(spool))  # the JSON as written: it holds "\ud800"
    assert [s["name"] for s in spans if s["name"].startswith("bad")] == ["bad\ud800name"]
    assert [r for r in caplog.records if r.name == "cirron"] == []
    from cirron.exporters import spool_reader

    spans, (problem,) = spool_reader.read_spans(str(spool))  # what show and export read
    assert [s.name for s in spans if s.name.startswith("bad")] == ["bad\ufffdname"]
    assert problem.file.endswith(BAD) and "U+FFFD" in problem.reason and not problem.whole


def test_a_file_not_named_as_a_spool_file_is_passed_over_silently(spool, good, caplog):
    (spool / "spool" / "notes-x.json").write_text('{"notes": "not spans"}')
    (spool / "spool" / f".{BAD}.123.0.tmp").write_bytes(with_span(good))  # being written
    with caplog.at_level(logging.WARNING, logger="cirron"):
        spans = ci.spool_spans(str(spool))
    assert ids(spans) == ids(spans_of(good))
    assert [r for r in caplog.records if r.name == "cirron"] == []
    shown = cirron("show", str(spool), cwd=spool.parent)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr


def test_a_symlink_loop_named_as_a_spool_file_is_named_and_the_rest_read(spool, good, caplog):
    (spool / "spool" / BAD).symlink_to(BAD)  # a link to itself: even asking what it is fails
    with caplog.at_level(logging.WARNING, logger="cirron"):
        spans = ci.spool_spans(str(spool))
    assert ids(spans) == ids(spans_of(good))
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert BAD in warning and "symbolic links" in warning
    listed = cirron("runs", str(spool), cwd=spool.parent)
    assert listed.returncode == 0, listed.stderr
    named_once(listed.stderr, BAD, "symbolic links")
    assert len(listed.stdout.splitlines()) == 2  # the heading and the one run


def test_show_ranks_of_a_spool_where_nothing_reads_says_so_in_one_line():
    with tempfile.TemporaryDirectory(prefix="cirron-spool-") as directory:
        folder = Path(directory) / ".cirron" / "spool"
        folder.mkdir(parents=True)
        (folder / BAD).write_text("garbage")
        shown = cirron("show", "--ranks", cwd=Path(directory))
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    skipped, said = shown.stderr.strip().splitlines()
    assert BAD in skipped and said == "cirron: no spans read from .cirron: no ranks to line up"


def test_a_bad_span_is_skipped_and_the_good_spans_of_its_file_are_kept(spool, good, caplog):
    request = json.loads(with_span(good))
    span = spans_of(request)[0]
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans.append(span | {"spanId": "abcdef0123456780", "startTimeUnixNano": "soon"})
    spans.append(span | {"spanId": "abcdef0123456781", "name": "kept"})
    (spool / "spool" / BAD).write_text(json.dumps(request))
    with caplog.at_level(logging.WARNING, logger="cirron"):
        names = [s["name"] for s in ci.spool_spans(str(spool))]
    assert names.count("extra") == 1 and names.count("kept") == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert BAD in warning and "1 of 3 spans" in warning and "startTimeUnixNano" in warning


def test_a_bad_attribute_is_dropped_and_its_span_kept(spool, good, caplog):
    attributes = [
        {"key": "fine", "value": {"intValue": "7"}},
        {"key": "broken", "value": {"intValue": "seven"}},
        {"key": "deep", "value": {"arrayValue": {"values": [{"arrayValue": {}}]}}},
        {"key": "not base64", "value": {"bytesValue": "é"}},
    ]
    (spool / "spool" / BAD).write_bytes(with_span(good, attributes=attributes))
    with caplog.at_level(logging.WARNING, logger="cirron"):
        (extra,) = [s for s in ci.spool_spans(str(spool)) if s["name"] == "extra"]
    assert [a["key"] for a in extra["attributes"]] == ["fine", "deep"]
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert BAD in warning and "2 attributes dropped" in warning and "intValue" in warning


def test_a_value_nested_deeper_than_any_reader_goes_is_dropped_not_recursed(spool, good, caplog):
    levels = 300  # as deep as json.loads goes (3 JSON levels each)
    deep = '{"arrayValue":{"values":[' * levels + '{"stringValue":"x"}' + "]}}" * levels
    attributes = b'"attributes": [{"key": "deep", "value": ' + deep.encode() + b"}]"
    (spool / "spool" / BAD).write_bytes(with_span(good).replace(b'"attributes": []', attributes))
    with caplog.at_level(logging.WARNING, logger="cirron"):
        (extra,) = [s for s in ci.spool_spans(str(spool)) if s["name"] == "extra"]
    assert extra["attributes"] == []
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert BAD in warning and "nested more than" in warning


@pytest.mark.parametrize("where", ["the spool folder", "one file"])
def test_the_path_can_be_the_spool_folder_or_one_file(spool, good, where, shown_alone):
    from cirron.exporters import spool_reader

    path = spool / "spool" if where == "the spool folder" else spool / "spool" / GOOD
    assert ids(ci.spool_spans(str(path))) == ids(spans_of(good))
    assert Path(spool_reader.cirron_directory(str(path))).resolve() == spool.resolve()
    shown = cirron("show", str(path), cwd=spool.parent)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == shown_alone


# -- parent cycles and deep trees -----------------------------------------------------------
def span_dict(span_id: str, parent: str | None, name: str, start: int) -> dict[str, Any]:
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": span_id, "name": name,
            "kind": 1, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10_000)}  # fmt: skip
    return span | ({"parentSpanId": parent} if parent else {})


def write_spans(folder: Path, spans: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True)
    request = {"resourceSpans": [{"resource": {"attributes": []},
                                  "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}  # fmt: skip
    (folder / "1-000001.json").write_text(json.dumps(request))


def test_a_span_that_is_its_own_parent_or_in_a_parent_cycle_is_shown_at_the_root(tmp_path):
    t = 1_700_000_000_000_000_000
    write_spans(tmp_path / ".cirron" / "spool", [
        span_dict("00000000000000a1", None, "root", t),
        span_dict("00000000000000a2", "00000000000000a1", "child", t + 1),
        span_dict("00000000000000b1", "00000000000000b1", "own_parent", t + 2),
        span_dict("00000000000000c1", "00000000000000c2", "cycle_a", t + 3),
        span_dict("00000000000000c2", "00000000000000c1", "cycle_b", t + 4),
        span_dict("00000000000000c3", "00000000000000c2", "below_cycle", t + 5),
    ])  # fmt: skip
    shown = cirron("show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert [line.split(" - ")[0] for line in lines] == [
        "root", "  child", "own_parent", "cycle_a", "  cycle_b", "    below_cycle",
    ]  # fmt: skip
    assert [line.endswith("(parent cycle)") for line in lines] == [
        False, False, True, True, False, False,
    ]  # fmt: skip
    roots = json.loads(cirron("show", "--format", "json", cwd=tmp_path).stdout)
    assert [(root["name"], root.get("note")) for root in roots] == [
        ("root", None), ("own_parent", "parent cycle"), ("cycle_a", "parent cycle"),
    ]  # fmt: skip
    # The findings and the report walk the tree too: they end, and say what they can.
    diagnosed = cirron("show", "--diagnose", cwd=tmp_path)
    assert diagnosed.returncode == 0 and diagnosed.stdout.startswith("run "), diagnosed.stderr
    reported = cirron("report", "-o", str(tmp_path / "report.html"), cwd=tmp_path)
    assert reported.returncode == 0 and (tmp_path / "report.html").exists(), reported.stderr


def test_a_chain_of_5000_nested_spans_prints(tmp_path):
    t = 1_700_000_000_000_000_000
    chain = [
        span_dict(f"{n + 1:016x}", f"{n:016x}" if n else None, f"level{n}", t + n)
        for n in range(5_000)
    ]
    write_spans(tmp_path / ".cirron" / "spool", chain)
    shown = cirron("show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = shown.stdout.splitlines()
    assert len(lines) == 5_000 and lines[-1].startswith(" " * 2 * 4_999 + "level4999 - ")
    table = cirron("show", "--format", "df-csv", cwd=tmp_path)
    assert table.returncode == 0 and table.stdout.splitlines()[-1].startswith("level4999,")
    as_json = cirron("show", "--format", "json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    assert as_json.stdout.count('"name": "level') == 5_000
    from cirron.exporters import spool_reader
    from cirron.offline import readback

    spans, _problems = spool_reader.read_spans(str(tmp_path / ".cirron"))
    notebook = readback.render_spans(spans, "text")  # as a notebook shows it
    assert notebook._repr_html_().count("<details") == 4_999


# -- any input at all -----------------------------------------------------------------------
KEYS = st.sampled_from(
    ["resourceSpans", "scopeSpans", "spans", "resource", "scope", "attributes", "key", "value",
     "values", "traceId", "spanId", "parentSpanId", "name", "startTimeUnixNano",
     "endTimeUnixNano", "events", "links", "status", "code", "kind", "stringValue", "intValue",
     "doubleValue", "boolValue", "arrayValue", "kvlistValue", "bytesValue"]
) | st.text(max_size=6)  # fmt: skip
TEXT = st.text(max_size=8) | st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010))
LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
JSON = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


def mutate(good: dict[str, Any], data: st.DataObject) -> tuple[Any, list[Any]]:
    """A copy of ``good`` with one subtree (chosen at random, the deeper the likelier)
    replaced by random JSON, and the path to it."""
    document = copy.deepcopy(good)
    path: list[Any] = []
    node: Any = document
    while isinstance(node, (dict, list)) and node and data.draw(st.integers(0, 9)) < 9:
        key = data.draw(
            st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node)))
        )
        path.append(key)
        node = node[key]
    replacement = data.draw(JSON)
    if not path:
        return replacement, path
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = replacement
    return document, path


def untouched(good: dict[str, Any], path: list[Any]) -> collections.Counter[tuple[str, str]]:
    """The spans of ``good`` that a replacement at ``path`` leaves alone, with their envelopes."""
    kept: list[dict[str, Any]] = []
    for r, resource_spans in enumerate(good["resourceSpans"]):
        for s, scope_spans in enumerate(resource_spans["scopeSpans"]):
            for k, span in enumerate(scope_spans["spans"]):
                where = ["resourceSpans", r, "scopeSpans", s, "spans", k]
                envelopes = (where, ["resourceSpans", r, "resource"], where[:4] + ["scope"])
                if where[: len(path)] != path and not any(
                    path[: len(envelope)] == envelope for envelope in envelopes
                ):
                    kept.append(span)
    return ids(kept)


def read_everything(directory: Path, good: dict[str, Any]) -> list[Any]:
    """The spool read by every reader: each keeps the good file's spans, names only the bad
    file, and what it reads goes through the show, the runs, the Chrome export and the OTLP
    exporter's encoding."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from cirron.exporters import spool_reader
    from cirron.offline import chrome, readback, runs

    spans, problems = spool_reader.read_spans(str(directory))
    assert ids(spans_of(good)) <= ids(spans)
    assert all(problem.file.endswith(BAD) for problem in problems)
    assert ids(ci.spool_spans(str(directory))) == ids(spans)
    readback.render_spans(spans, "text")
    runs.runs_of(spans)
    json.dumps(chrome.chrome_events(spans), allow_nan=False)
    encode_spans(spans).SerializeToString()
    return spans


FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(data=st.data())
def test_a_mutated_spool_file_keeps_every_span_it_did_not_touch(good_file, good, data):
    document, path = mutate(good, data)
    with new_spool(good_file) as directory:
        folder = Path(directory) / ".cirron" / "spool"
        text = json.dumps(document)  # a lone surrogate is written as "\ud800"
        (folder / BAD).write_text(text)
        read_everything(folder.parent, good)
        from cirron.exporters import spool_reader

        (bad,) = spool_reader.read_files([str(folder / BAD)])
    assert untouched(good, path) <= ids(bad.spans)


@FAST
@given(document=JSON | JSON.map(lambda value: {"resourceSpans": value}))
def test_random_json_next_to_a_good_file_never_breaks_the_reader(good_file, good, document):
    with new_spool(good_file) as directory:
        folder = Path(directory) / ".cirron" / "spool"
        (folder / BAD).write_text(json.dumps(document))
        assert ids(read_everything(folder.parent, good)) == ids(spans_of(good))


@FAST
@given(content=st.binary(max_size=300))
def test_random_bytes_next_to_a_good_file_never_break_the_reader(good_file, good, content):
    with new_spool(good_file) as directory:
        folder = Path(directory) / ".cirron" / "spool"
        (folder / BAD).write_bytes(content)
        assert ids(read_everything(folder.parent, good)) == ids(spans_of(good))


# -- any valid span at all ------------------------------------------------------------------
def hex_digits(count: int) -> st.SearchStrategy[str]:
    """An id: ``count`` hex digits, not all zeros."""
    return st.integers(1, 16**count - 1).map(lambda number: f"{number:0{count}x}")


U64 = st.integers(0, 2**64 - 1)
TIMES = U64 | U64.map(str) | st.integers(1_700_000_000 * 10**9, 1_700_000_001 * 10**9)
ATTRIBUTE_KEYS = st.sampled_from(
    ["index", "cirron.parent_span_id", "cirron.rank", "value", "mark.loss", "framework",
     "service.instance.id", "host.name", "process.pid", "cirron.run_id", "service.name"]
) | TEXT.filter(bool)  # fmt: skip
SCALARS = st.one_of(
    st.just({}),
    st.builds(lambda v: {"stringValue": v}, TEXT | hex_digits(16)),
    st.builds(lambda v: {"boolValue": v}, st.booleans()),
    st.builds(
        lambda v: {"intValue": v},
        st.integers(-(2**63), 2**63 - 1).flatmap(lambda n: st.sampled_from([n, str(n)])),
    ),  # fmt: skip
    st.builds(lambda v: {"doubleValue": v}, st.floats() | st.sampled_from(["NaN", "-Infinity"])),
    st.builds(lambda v: {"bytesValue": base64.b64encode(v).decode()}, st.binary(max_size=4)),
)
ANY_VALUE = st.recursive(
    SCALARS,
    lambda inner: (
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(inner, max_size=3))
        | st.builds(
            lambda pairs: {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in pairs]}},
            st.lists(st.tuples(ATTRIBUTE_KEYS, inner), max_size=3),
        )
    ),
    max_leaves=4,
)
ATTRIBUTES = st.lists(
    st.builds(lambda k, v: {"key": k, "value": v}, ATTRIBUTE_KEYS, ANY_VALUE), max_size=3
)
SPAN_NAMES = st.sampled_from(["cirron.session", "epoch", "step", "batch", "snapshot"]) | TEXT


@st.composite
def valid_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request of valid spans holding anything valid: any text, value and time, parents
    that are missing, the span itself, or in a cycle."""
    pool = draw(st.lists(hex_digits(16), min_size=1, max_size=6, unique=True))
    trace = draw(hex_digits(32))
    spans = []
    for _ in range(draw(st.integers(1, 6))):
        span = {"traceId": trace, "spanId": draw(st.sampled_from(pool)), "name": draw(SPAN_NAMES),
                "kind": draw(st.integers(0, 5)), "startTimeUnixNano": draw(TIMES),
                "attributes": draw(ATTRIBUTES)}  # fmt: skip
        if draw(st.booleans()):
            span["parentSpanId"] = draw(st.sampled_from(pool))
        if draw(st.integers(0, 3)):
            span["endTimeUnixNano"] = draw(TIMES)
        span["events"] = draw(st.lists(st.builds(
            lambda t, n, a: {"timeUnixNano": t, "name": n, "attributes": a},
            TIMES, SPAN_NAMES | st.just("loss"), ATTRIBUTES), max_size=2))  # fmt: skip
        span["status"] = {"code": draw(st.integers(0, 2)), "message": draw(TEXT)}
        spans.append(span)
    return {"resourceSpans": [{"resource": {"attributes": draw(ATTRIBUTES)},
                               "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]}  # fmt: skip


@FAST
@given(request=valid_requests())
def test_whatever_valid_spans_a_file_holds_every_view_shows_each_once(request):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from cirron.exporters import spool_reader
    from cirron.offline import chrome, readback, runs

    with tempfile.TemporaryDirectory(prefix="cirron-spool-") as directory:
        name = Path(directory) / BAD
        name.write_text(json.dumps(request))
        (read,) = spool_reader.read_files([str(name)])
    assert len(read.spans) == len(spans_of(request))  # every span reads
    text = readback.render_spans(read.spans, "text")
    assert len(text.splitlines()) == len(read.spans)  # none lost to a parent cycle
    roots = json.loads(readback.render_spans(read.spans, "json"))
    assert sum(1 for _ in readback._walk(roots)) == len(read.spans)
    json.dumps(chrome.chrome_events(read.spans), allow_nan=False)
    assert sum(len(run.spans) for run in runs.runs_of(read.spans)) == len(read.spans)
    encode_spans(read.spans).SerializeToString()


def test_decode_request_is_strict_and_names_what_is_wrong(good):
    from cirron.exporters.otlp_json_decoder import decode_request

    assert ids(decode_request(good)) == ids(spans_of(good))
    broken = copy.deepcopy(good)
    spans_of(broken)[2]["traceId"] = "not hex"
    with pytest.raises(ValueError, match=r"spans\[2\]: traceId is not 32 hex digits"):
        decode_request(broken)
    with pytest.raises(ValueError, match="resourceSpans"):
        decode_request({"resourceSpans": {}})
