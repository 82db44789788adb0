from __future__ import annotations

import json
import logging
import math

import pytest

import cirron as ci


def marks_of(name):
    (node,) = ci.trace(format="dict", name=name)
    return node["marks"]


def test_point_mark_is_an_event_on_the_innermost_scope():
    with ci.scope("epoch"):
        with ci.scope("batch"):
            ci.mark("loss", 0.25, phase="train")
        ci.mark("lr", 1e-3)
    (batch_mark,) = marks_of("batch")
    assert batch_mark["name"] == "loss"
    assert batch_mark["value"] == 0.25
    assert batch_mark["kind"] == "point"
    assert isinstance(batch_mark["time_ns"], int)
    assert [m["name"] for m in marks_of("epoch")] == ["lr"]


def test_summary_mark_is_a_span_attribute():
    with ci.scope("epoch", index=0):
        ci.mark("val_accuracy", 0.91, kind="summary")
    (epoch,) = ci.trace(format="dict", name="epoch")
    assert epoch["attributes"]["mark.val_accuracy"] == 0.91
    assert epoch["marks"] == [
        {"name": "val_accuracy", "value": 0.91, "kind": "summary", "time_ns": epoch["end_ns"]}
    ]


def test_mark_without_scope_lands_on_the_session():
    ci.mark("setup_seconds", 3)
    root = ci.trace(format="dict")
    assert [m["name"] for m in root["marks"]] == ["setup_seconds"]


@pytest.mark.parametrize("value", [1, 2.5, True, "adam"])
def test_plain_values_are_kept_as_they_are(value):
    with ci.scope("s"):
        ci.mark("v", value)
    assert marks_of("s")[0]["value"] == value
    assert type(marks_of("s")[0]["value"]) is type(value)


def test_zero_d_numpy_and_torch_values_are_unwrapped():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    with ci.scope("s"):
        ci.mark("np_scalar", np.float32(0.5))
        ci.mark("np_array", np.array(3))
        ci.mark("tensor", torch.tensor(1.5, requires_grad=True).sum())
        ci.mark("int_tensor", torch.tensor(7))
    values = {m["name"]: m["value"] for m in marks_of("s")}
    assert values == {"np_scalar": 0.5, "np_array": 3, "tensor": 1.5, "int_tensor": 7}


def test_one_element_tensors_and_arrays_are_their_value():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    loss = torch.tensor([1.5], requires_grad=True) * 1  # what loss.view(1) gives
    with ci.scope("s"):
        ci.mark("view", loss)
        ci.mark("metric", np.array([[0.25]]))
        ci.mark("count", torch.tensor([3]), kind="summary")
    values = {m["name"]: m["value"] for m in marks_of("s")}
    assert values == {"view": 1.5, "metric": 0.25, "count": 3}


@pytest.mark.parametrize("value", [None, [1.0], {"a": 1}, object(), 1 + 2j, 2**70])
def test_a_value_no_mark_can_hold_is_dropped_with_one_warning_per_name(value, caplog):
    with caplog.at_level(logging.WARNING, logger="cirron"), ci.scope("s"):
        for _ in range(3):
            ci.mark("loss", value)  # every step of a loop: training goes on
        ci.mark("lr", 0.1)
    assert [m["name"] for m in marks_of("s")] == ["lr"]
    assert ci.health()["marks_invalid"] == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "cirron"]
    assert len(warnings) == 1 and "mark 'loss'" in warnings[0], warnings


def test_a_tensor_of_several_elements_is_dropped_and_named():
    torch = pytest.importorskip("torch")
    with ci.scope("s"):
        ci.mark("loss", torch.tensor([1.0, 2.0]))
        ci.mark("grads", torch.ones(3), kind="summary")
    assert marks_of("s") == []
    assert ci.health()["marks_invalid"] == 2


def test_bad_mark_name_and_kind():
    with pytest.raises(TypeError, match="mark name"):
        ci.mark(None, 1.0)
    with pytest.raises(ValueError, match="kind"):
        ci.mark("loss", 1.0, kind="histogram")


def test_nan_and_inf_survive_read_back_and_the_spool():
    ci.profile(output="spool")
    with ci.scope("s"):
        ci.mark("nan", float("nan"))
        ci.mark("inf", float("inf"))
        ci.mark("ninf", float("-inf"), kind="summary")
    values = {m["name"]: m["value"] for m in marks_of("s")}
    assert math.isnan(values["nan"]) and values["inf"] == math.inf and values["ninf"] == -math.inf
    ci.flush()
    (span,) = [s for s in ci.spool_spans() if s["name"] == "s"]
    events = {e["name"]: e["attributes"][0]["value"]["doubleValue"] for e in span["events"]}
    assert events == {"nan": "NaN", "inf": "Infinity"}
    summary = {a["key"]: a["value"] for a in span["attributes"]}
    assert summary["mark.ninf"] == {"doubleValue": "-Infinity"}
    for request in ci.read_spool():  # strict JSON: no bare NaN tokens
        json.dumps(request, allow_nan=False)


def test_nan_survives_the_stdout_sink(capsys):
    ci.profile(output="stdout")
    with ci.scope("s"):
        ci.mark("loss", float("nan"))
    ci.flush()
    assert "[cirron] s - " in capsys.readouterr().out
    assert "{loss=nan}" in ci.trace(name="s")


def test_marks_past_the_event_limit_are_counted_not_silent():
    ci.profile(output="none", config={"max_events": 5})
    with ci.scope("s"):
        for i in range(8):
            ci.mark("loss", float(i))
    assert ci.health()["marks_dropped"] == 3
    assert [m["value"] for m in marks_of("s")] == [3.0, 4.0, 5.0, 6.0, 7.0]


def test_a_value_still_on_a_device_is_read_later_by_the_framework_reader(monkeypatch):
    """Where no GPU exists, a stand-in device reader: the value is filled in at read-back
    and before export, never read at the mark (the CUDA reader itself runs in test_gpu_time)."""
    torch = pytest.importorskip("torch")
    import cirron.otel.values

    asked = []

    def reader(tensor):
        def resolve(final):
            asked.append(final)
            return 2.5 if final or len(asked) > 1 else None  # "the device got there" later

        return resolve

    ci.profile(output="spool")
    monkeypatch.setattr(cirron.otel.values, "device_reader", [reader])
    on_device = torch.empty(1, device="meta")  # a tensor whose values aren't on the host
    with ci.scope("s"):
        ci.mark("loss", on_device)
        ci.mark("best", on_device, kind="summary")
    assert asked == []  # nothing read at the mark
    ci.flush()
    (span,) = [s for s in ci.spool_spans() if s["name"] == "s"]
    assert span["events"][0]["attributes"][0]["value"] == {"doubleValue": 2.5}
    assert {a["key"]: a["value"] for a in span["attributes"]}["mark.best"] == {"doubleValue": 2.5}


def test_a_tensor_that_cannot_be_read_is_dropped_not_raised():
    torch = pytest.importorskip("torch")
    with ci.scope("s"):
        ci.mark("loss", torch.empty(1, device="meta"))  # no reader for it: read now, fails
    assert marks_of("s") == []
    assert ci.health()["marks_invalid"] == 1
