"""Promise 6: a wrong argument is a clear error naming it; anything else works, from any thread.

Every public function gets wrong types and values, with and without a running
profiler: each call raises ``TypeError``/``ValueError`` with the argument's
name in the message, before anything is recorded, and the profiler runs on
untouched (no export error, no restarted thread). Legal but awkward input (NaN
and infinities, unicode and lone surrogates, 200-deep scopes, scopes left
open, marks without a scope, calls before ``ci.profile()`` and after
``ci.shutdown()``, 16 threads at once, ``ci.profile()`` racing itself) just
works. Random sequences of all of it: ``test_api_properties.py``.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import os
import threading

import pytest
from faults import assert_spool_intact

import cirron as ci
from support import assert_consistent, named

NAN, INF = float("nan"), float("inf")


def _scope(*args, **kwargs):
    with ci.scope(*args, **kwargs):
        pass


# (what, call, exception, words the message must contain)
BAD_CALLS = [
    ("profile config", lambda: ci.profile(config=3), TypeError, "config"),
    ("profile enabled", lambda: ci.profile(enabled="yes"), TypeError, "enabled"),
    ("profile flush_interval 0", lambda: ci.profile(flush_interval=0), ValueError, "flush_interval"),
    ("profile flush_interval nan", lambda: ci.profile(flush_interval=NAN), ValueError, "flush_interval"),
    ("profile flush_interval str", lambda: ci.profile(flush_interval="1"), TypeError, "flush_interval"),
    ("profile output", lambda: ci.profile(output="disk"), ValueError, "output"),
    ("profile output list", lambda: ci.profile(output=["spool", 3]), TypeError, "output"),
    ("profile frameworks", lambda: ci.profile(frameworks=["jax"]), ValueError, "frameworks"),
    ("profile sample_rate", lambda: ci.profile(sample_rate=2), ValueError, "sample_rate"),
    ("profile snapshots", lambda: ci.profile(snapshots="all"), ValueError, "snapshots"),
    ("profile path empty", lambda: ci.profile(path=""), ValueError, "path"),
    ("profile path int", lambda: ci.profile(path=3), TypeError, "path"),
    ("profile buffer_size", lambda: ci.profile(config={"buffer_size": 0}), ValueError, "buffer_size"),
    ("profile exit_timeout", lambda: ci.profile(config={"exit_timeout": -1}), ValueError, "exit_timeout"),
    ("profile exit_timeout inf", lambda: ci.profile(config={"exit_timeout": INF}), ValueError, "exit_timeout"),
    ("profile max_events", lambda: ci.profile(config={"max_events": 1.5}), TypeError, "max_events"),
    ("profile spool_max_bytes", lambda: ci.profile(config={"spool_max_bytes": -1}), ValueError, "spool_max_bytes"),
    ("scope name None", lambda: ci.scope(None), TypeError, "scope name"),
    ("scope name empty", lambda: ci.scope(""), ValueError, "scope name"),
    ("scope name bytes", lambda: ci.scope(b"x"), TypeError, "scope name"),
    ("scope index str", lambda: ci.scope("s", index="1"), TypeError, "index"),
    ("scope index float", lambda: ci.scope("s", index=1.5), TypeError, "index"),
    ("scope index bool", lambda: ci.scope("s", index=True), TypeError, "index"),
    ("scope index nan", lambda: ci.scope("s", index=NAN), TypeError, "index"),
    ("scope attribute object", lambda: ci.scope("s", x=object()), TypeError, "'x'"),
    ("scope attribute None", lambda: ci.scope("s", x=None), TypeError, "'x'"),
    ("scope attribute dict", lambda: ci.scope("s", x={"a": 1}), TypeError, "'x'"),
    ("scope attribute mixed list", lambda: ci.scope("s", x=[1, "a"]), TypeError, "'x'"),
    ("scope attribute 2**70", lambda: ci.scope("s", x=2**70), ValueError, "'x'"),
    ("mark name None", lambda: ci.mark(None, 1.0), TypeError, "mark name"),
    ("mark name empty", lambda: ci.mark("", 1.0), ValueError, "mark name"),
    ("mark kind", lambda: ci.mark("loss", 1.0, kind="total"), ValueError, "kind"),
    ("mark kind None", lambda: ci.mark("loss", 1.0, kind=None), ValueError, "kind"),
    ("mark attribute", lambda: ci.mark("loss", 1.0, step=object()), TypeError, "'step'"),
    ("epochs None", lambda: ci.epochs(None), TypeError, "ci.epochs"),
    ("epochs int", lambda: ci.epochs(3), TypeError, "ci.epochs"),
    ("batches object", lambda: ci.batches(object()), TypeError, "ci.batches"),
    ("wrap None", lambda: ci.wrap(None), TypeError, "estimator"),
    ("wrap int", lambda: ci.wrap(3), TypeError, "estimator"),
    ("watch None", lambda: ci.watch(None), TypeError, "ci.watch"),
    ("watch str", lambda: ci.watch("model"), TypeError, "ci.watch"),
    ("trace format", lambda: ci.trace(format="xml"), ValueError, "format"),
    ("trace format int", lambda: ci.trace(format=1), ValueError, "format"),
    ("trace name", lambda: ci.trace(name=3), TypeError, "name"),
    ("trace last negative", lambda: ci.trace(last=-1), ValueError, "last"),
    ("trace last str", lambda: ci.trace(last="3"), ValueError, "last"),
    ("flush timeout str", lambda: ci.flush(timeout="1"), TypeError, "timeout"),
    ("flush timeout bool", lambda: ci.flush(timeout=True), TypeError, "timeout"),
    ("flush timeout negative", lambda: ci.flush(timeout=-1), ValueError, "timeout"),
    ("flush timeout nan", lambda: ci.flush(timeout=NAN), ValueError, "timeout"),
    ("flush timeout inf", lambda: ci.flush(timeout=INF), ValueError, "timeout"),
    ("health argument", lambda: ci.health(1), TypeError, "health()"),
    ("shutdown argument", lambda: ci.shutdown(1), TypeError, "shutdown()"),
]  # fmt: skip


@pytest.fixture(params=["no profiler", "profiling"])
def state(request, tmp_path):
    if request.param == "profiling":
        ci.profile(path=str(tmp_path / "trace"), flush_interval=0.05, frameworks=[])
    yield request.param
    ci.shutdown()


@pytest.mark.parametrize("what, call, error, words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_a_wrong_argument_is_an_error_naming_it(state, what, call, error, words):
    before = ci.health()
    with pytest.raises(error) as raised:
        call()
    assert words in str(raised.value), str(raised.value)
    after = ci.health()
    # Nothing was recorded, nothing broke.
    assert after["spans_ended"] == before["spans_ended"]
    assert after["marks_dropped"] == before["marks_dropped"]
    assert after["export_errors"] == after["hook_errors"] == after["threads_restarted"] == 0
    assert after["enabled"] is (state == "profiling")


BAD_MARK_VALUES = [None, [1.0], b"1", 1j, object(), 2**70]


def _value_id(value: object) -> str:
    """The value's repr, but an object's without its address: pytest-xdist's processes must
    collect the same test ids."""
    return "object()" if type(value) is object else repr(value)


@pytest.mark.parametrize("value", BAD_MARK_VALUES, ids=_value_id)
def test_a_mark_value_nothing_can_hold_is_dropped_and_counted_not_raised(state, value):
    """A mark runs on the training thread at every step: its value never stops training."""
    before = ci.health()
    ci.mark("loss", value)
    ci.mark("loss", value, kind="summary")
    after = ci.health()
    assert after["marks_invalid"] == before["marks_invalid"] + 2
    assert after["spans_ended"] == before["spans_ended"]
    assert after["hook_errors"] == 0
    with pytest.raises(ValueError, match="kind"):  # the API's own checks stay errors
        ci.mark("loss", value, kind="total")


def test_bad_calls_leave_a_running_profiler_exporting(tmp_path):
    path = tmp_path / "trace"
    ci.profile(path=str(path), flush_interval=0.02, frameworks=[])
    for _what, call, error, _words in BAD_CALLS:
        with pytest.raises(error):
            call()
        _scope("after-a-bad-call")
    assert ci.flush() is True
    health = ci.health()
    assert health["export_errors"] == health["threads_restarted"] == health["spans_dropped"] == 0
    assert health["enabled"] is True
    assert [t.name for t in threading.enumerate() if t.name == "cirron-flush"] == ["cirron-flush"]
    ci.shutdown()
    spans = ci.spool_spans(str(path))
    assert len(named(spans, "after-a-bad-call")) == len(BAD_CALLS)


# -- legal but awkward ------------------------------------------------------------------


def test_nan_infinities_unicode_and_lone_surrogates_survive_the_spool(tmp_path):
    path = tmp_path / "trace"
    ci.profile(path=str(path), frameworks=[])
    texts = ["naïve", "训练", "🔥🚀", "مرحبا", "e\u0301", "\ud800", "a\x00b", "\u2028"]
    with ci.scope("values", nan=NAN, inf=INF, minus_inf=-INF, texts=texts):
        for number in (NAN, INF, -INF, 0.0, -0.0, 1e308, 5e-324):
            ci.mark("number", number)
        for text in texts:
            ci.mark(text, text)
            with ci.scope(text, label=text):
                pass
    ci.shutdown()
    assert assert_spool_intact(path) == 2 + len(texts)  # session, values, one per text
    (values,) = named(ci.spool_spans(str(path)), "values")
    attributes = {kv["key"]: kv["value"] for kv in values["attributes"]}
    assert attributes["nan"] == {"doubleValue": "NaN"}
    assert attributes["minus_inf"] == {"doubleValue": "-Infinity"}
    marks = [e for e in values["events"] if e["name"] == "number"]
    assert [m["attributes"][0]["value"]["doubleValue"] for m in marks][:3] == [
        "NaN",
        "Infinity",
        "-Infinity",
    ]
    names = [e["name"] for e in values["events"] if e["name"] != "number"]
    assert names == texts  # every text back exactly, the lone surrogate included
    text = ci.trace()  # the text form copes too
    assert "values" in text and "\x00" not in text


def test_scopes_200_deep_run_and_record_the_first_64(tmp_path):
    path = tmp_path / "trace"
    ci.profile(path=str(path), frameworks=[])

    def dive(depth):
        if depth == 200:
            ci.mark("bottom", depth)
            return depth
        with ci.scope("level", index=depth):
            return dive(depth + 1)

    assert dive(0) == 200
    assert ci.health()["scopes_too_deep"] == 200 - 64
    ci.shutdown()
    spans = ci.spool_spans(str(path))
    assert_consistent(spans)
    assert len(named(spans, "level")) == 64


def test_scopes_left_open_and_marks_without_scope_end_up_closed_in_the_spool(tmp_path):
    path = tmp_path / "trace"
    ci.profile(path=str(path), frameworks=[])
    ci.mark("before_any_scope", 1)  # lands on cirron.session

    def abandon():  # a worker thread that opens scopes and dies without closing them
        ci.scope("abandoned-outer").__enter__()
        ci.scope("abandoned-inner").__enter__()

    worker = threading.Thread(target=abandon)
    worker.start()
    worker.join()

    def leave_open():  # in the main thread, in a context of its own (the test's stays clean)
        ci.scope("left-open").__enter__()
        loop = ci.epochs(range(3))
        next(loop)  # an epoch whose loop is never finished
        return loop

    context = contextvars.copy_context()
    loop = context.run(leave_open)
    ci.shutdown()
    context.run(loop.close)  # what the loop's finalizer would do, in its own context
    spans = ci.spool_spans(str(path))
    assert_consistent(spans)
    names = collections.Counter(s["name"] for s in spans)
    assert names == {
        "cirron.session": 1,
        "abandoned-outer": 1,
        "abandoned-inner": 1,
        "left-open": 1,
        "epoch": 1,
    }
    (session,) = named(spans, "cirron.session")
    assert [e["name"] for e in session["events"]] == ["before_any_scope"]


def test_calls_before_profile_and_after_shutdown_work_and_write_nothing(tmp_path):
    assert isinstance(ci.trace(), str)  # before anything: an empty trace
    assert ci.trace(format="dict") is None or isinstance(ci.trace(format="dict"), dict)
    assert ci.flush() is True
    assert ci.health()["enabled"] is False
    path = tmp_path / "trace"
    ci.profile(path=str(path), frameworks=[])
    _scope("during")
    ci.shutdown()
    files = sorted(os.listdir(path / "spool"))
    for _ in ci.epochs(range(2)):
        for _ in ci.batches(range(2)):
            _scope("after")
            ci.mark("loss", 0.1)
    assert ci.flush() is True and ci.flush(timeout=0) is True
    assert ci.health()["enabled"] is False
    assert "after" in ci.trace()
    ci.shutdown()
    ci.shutdown()
    assert sorted(os.listdir(path / "spool")) == files  # nothing more was written


def test_sixteen_threads_at_once_lose_nothing(tmp_path):
    path = tmp_path / "trace"
    ci.profile(path=str(path), flush_interval=0.01, frameworks=[])
    start = threading.Barrier(16)
    errors = []

    def hammer(number):
        try:
            start.wait()
            for i in ci.batches(range(100)):
                with ci.scope("thread-work", thread=number, i=i):
                    ci.mark("loss", 1.0 / (i + 1))
                    ci.mark("last", i, kind="summary")
                if i % 25 == 0:
                    ci.flush(timeout=5)
                    ci.trace(last=5)
                    ci.health()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    health = ci.health()
    ci.shutdown()
    spans = ci.spool_spans(str(path))
    assert_consistent(spans)
    assert len(named(spans, "thread-work")) == len(named(spans, "batch")) == 16 * 100
    assert health["spans_dropped"] == health["export_errors"] == health["threads_restarted"] == 0


@pytest.mark.skipif(
    not os.access("/proc/thread-self/schedstat", os.R_OK), reason="needs /proc/thread-self"
)
def test_threads_that_measure_steps_at_once_each_read_a_file_of_their_own():
    # A file shared by the threads was closed by each thread that took it over, sometimes
    # twice, and the second close shut a spool file being written (its spans lost).
    from cirron.training import resources

    start = threading.Barrier(8)
    held = {}

    def measure(number):
        start.wait()
        for _ in range(50):
            assert resources.run_delay.ns() >= 0
        held[number] = resources.run_delay._local.file.fd
        start.wait()  # every file is still open here: eight different ones

    threads = [threading.Thread(target=measure, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(set(held.values())) == 8
    for fd in held.values():  # closed with their threads (or the number given to another file)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        assert not target.endswith("schedstat"), target


def test_profile_racing_itself_from_eight_threads_starts_one_profiler(tmp_path, caplog):
    start = threading.Barrier(8)
    handles = []

    def race():
        start.wait()
        handles.append(ci.profile(path=str(tmp_path / "trace"), frameworks=[]))

    with caplog.at_level(logging.WARNING, logger="cirron"):
        threads = [threading.Thread(target=race) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert len(handles) == 8 and len({id(h) for h in handles}) == 1
    assert sum("already called" in r.getMessage() for r in caplog.records) == 7
    assert [t.name for t in threading.enumerate()].count("cirron-flush") == 1
    ci.shutdown()
    assert len(named(ci.spool_spans(str(tmp_path / "trace")), "cirron.session")) == 1
