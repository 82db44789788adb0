from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import trace

import cirron as ci


def names(node):
    return [child["name"] for child in node["children"]]


def test_scopes_nest_under_the_session():
    with ci.scope("outer", index=3, variant="beam"):
        with ci.scope("inner"):
            pass
    root = ci.trace(format="dict")
    assert root["name"] == "cirron.session"
    (outer,) = root["children"]
    assert outer["name"] == "outer"
    assert outer["index"] == 3
    assert outer["attributes"] == {"index": 3, "variant": "beam"}
    assert outer["parent_id"] == root["span_id"]
    assert names(outer) == ["inner"]
    assert outer["children"][0]["parent_id"] == outer["span_id"]


def test_open_scope_is_the_current_otel_span():
    with ci.scope("region") as region:
        current = trace.get_current_span()
        assert current is region.span
        # A span of any other OTel instrumentation nests under the scope.
        other = trace.get_tracer("someone.else").start_span("http.request")
        other.end()
    assert not trace.get_current_span().is_recording()


def test_scope_as_decorator_opens_one_span_per_call():
    @ci.scope("evaluate", split="val")
    def evaluate(x):
        return x * 2

    @ci.scope
    def preprocess():
        return "done"

    assert evaluate(2) == 4
    assert evaluate(3) == 6
    assert preprocess() == "done"
    root = ci.trace(format="dict")
    assert names(root).count("evaluate") == 2
    assert any(name.endswith("preprocess") for name in names(root))


def test_async_decorator_and_tasks_nest_separately():
    @ci.scope("fetch")
    async def fetch(i):
        with ci.scope("parse", index=i):
            await asyncio.sleep(0.01)
        return i

    async def main():
        return await asyncio.gather(fetch(0), fetch(1))

    assert asyncio.run(main()) == [0, 1]
    fetches = ci.trace(format="dict", name="fetch")
    assert len(fetches) == 2
    assert sorted(names(f)[0] for f in fetches) == ["parse", "parse"]
    assert {f["children"][0]["index"] for f in fetches} == {0, 1}


def test_exception_marks_the_scope_failed_and_propagates():
    with pytest.raises(ZeroDivisionError):
        with ci.scope("step"):
            1 / 0  # noqa: B018
    (step,) = ci.trace(format="dict", name="step")
    assert step["status"] == "ERROR"
    assert step["end_ns"] is not None


def test_scopes_in_threads_are_children_of_the_session():
    ci.profile(output="none")

    def worker(i):
        with ci.scope("loader-thread", index=i):
            with ci.scope("decode"):
                pass

    with ci.scope("main-work"):
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    root = ci.trace(format="dict")
    assert sorted(names(root)) == ["loader-thread"] * 4 + ["main-work"]
    for node in root["children"]:
        if node["name"] == "loader-thread":
            assert names(node) == ["decode"]


def test_scopes_deeper_than_64_run_but_are_not_recorded(caplog):
    ran = []

    def nest(level):
        with ci.scope("level", index=level):
            if level < 69:
                nest(level + 1)
            else:
                ran.append(level)

    nest(0)
    assert ran == [69]
    assert ci.health()["scopes_too_deep"] == 6
    assert len(ci.trace(format="dict", name="level")) == 64
    assert sum("deeper than 64" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(("name", "error"), [(None, TypeError), ("", ValueError), (3, TypeError)])
def test_bad_scope_name_is_a_clear_error(name, error):
    with pytest.raises(error, match="scope name"):
        ci.scope(name)


def test_bad_scope_attribute_names_the_attribute():
    with pytest.raises(TypeError, match="'weights'"):
        ci.scope("x", weights=object())
    with pytest.raises(TypeError, match="index"):
        ci.scope("x", index="first")
    with pytest.raises(TypeError, match="index"):
        ci.scope("x", index=True)
    with pytest.raises(ValueError, match="index is out of the 64-bit integer range"):
        ci.scope("x", index=2**70)  # no OTLP encoder could send it


def test_numpy_and_torch_values_are_accepted_as_attributes():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    with ci.scope("x", index=np.int64(2), lr=torch.tensor(0.5), sizes=[1, 2]):
        pass
    (node,) = ci.trace(format="dict", name="x")
    assert node["attributes"] == {"index": 2, "lr": 0.5, "sizes": [1, 2]}
