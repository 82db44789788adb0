"""``ci.inference`` on a user's serving code: functions, methods, async functions, generators.

Each test is a user's script: a function decorated (or a block wrapped) the
way the inference guide shows, called, and its span read back with
``ci.trace(format="dict")``. The models are real and tiny: a torch module, a
scikit-learn estimator.
"""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import cirron as ci
from cirron.inference import calls
from cirron.otel import semconv as ci_names
from trees import kids, named


def spans(name: str = "inference") -> list[dict]:
    return ci.trace(format="dict", name=name)


def only(name: str = "inference") -> dict:
    (span,) = spans(name)
    return span


# -- the four ways in ---------------------------------------------------------------------------
def test_a_decorated_function_is_one_inference_span_per_call_with_its_batch_size():
    @ci.inference
    def predict(batch):
        return [len(item) for item in batch]

    assert predict(["a", "bb", "ccc"]) == [1, 2, 3]
    assert predict(["d"]) == [1]
    first, second = spans()
    assert first["attributes"][ci_names.BATCH_SIZE] == 3
    assert second["attributes"][ci_names.BATCH_SIZE] == 1
    assert first["attributes"][ci_names.CODE_FUNCTION_NAME].endswith("predict")
    assert first["status"] == "UNSET"
    assert first["duration_ns"] > 0


def test_named_decorator_with_attributes_and_a_wrapped_function():
    @ci.inference("classify", variant="fast")
    def classify(x):
        return x

    traced_sorted = ci.inference(sorted)
    classify([3, 1])
    assert traced_sorted([3, 1, 2]) == [1, 2, 3]
    span = only("classify")
    assert span["attributes"]["variant"] == "fast"
    assert only()["attributes"][ci_names.BATCH_SIZE] == 3


def test_a_block_records_what_it_was_given_and_what_it_produced():
    with ci.inference("rerank") as call:
        call.record_input([[0.1, 0.2], [0.3, 0.4]])
        call.set_attribute("candidates", 2)
        call.record_output([1, 0])
    span = only("rerank")
    assert span["attributes"][ci_names.BATCH_SIZE] == 2
    assert span["attributes"]["candidates"] == 2


def test_the_span_is_current_while_the_function_runs():
    seen = []

    @ci.inference
    def predict(x):
        seen.append(trace.get_current_span())
        return x

    predict([1])
    (current,) = seen
    assert current.get_span_context().span_id == int(only()["span_id"], 16)
    assert not trace.get_current_span().is_recording()


# -- models: torch, scikit-learn ---------------------------------------------------------------
def test_a_torch_model_method_records_its_name_device_and_its_forward_as_a_child(
    one_torch_thread,
):
    torch = pytest.importorskip("torch")
    ci.profile(output="none", frameworks=["torch"], metrics=False)

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(x)

        @ci.inference("classify")
        def classify(self, x):
            with torch.no_grad():
                return self(x).argmax(dim=1)

    model = Classifier().eval()
    labels = model.classify(torch.randn(5, 4))
    assert labels.shape == (5,)
    span = only("classify")
    assert span["attributes"][ci_names.BATCH_SIZE] == 5
    assert span["attributes"][ci_names.DEVICE] == "cpu"
    assert span["attributes"][ci_names.MODEL_NAME] == "Classifier"
    (forward,) = kids(span, "forward")
    assert forward["attributes"]["mode"] == "eval"
    assert named(ci.trace(format="dict"), "evaluate") == []


def test_a_scikit_learn_model_given_as_model_is_named():
    np = pytest.importorskip("numpy")
    pytest.importorskip("sklearn")
    from sklearn.linear_model import LogisticRegression

    x = np.random.default_rng(0).normal(size=(40, 3))
    y = (x[:, 0] > 0).astype(int)
    model = LogisticRegression().fit(x, y)

    @ci.inference(model=model)
    def predict(rows):
        return model.predict(rows)

    assert predict(x[:7]).shape == (7,)
    span = only()
    assert span["attributes"][ci_names.MODEL_NAME] == "LogisticRegression"
    assert span["attributes"][ci_names.BATCH_SIZE] == 7


def test_a_service_whose_model_is_an_attribute_is_named_after_it():
    pytest.importorskip("sklearn")
    from sklearn.dummy import DummyClassifier

    class Service:
        def __init__(self):
            self.model = DummyClassifier().fit([[0], [1]], [0, 1])

        @ci.inference
        def predict(self, rows):
            return self.model.predict(rows)

    Service().predict([[0], [1], [2]])
    assert only()["attributes"][ci_names.MODEL_NAME] == "DummyClassifier"
    assert only()["attributes"][ci_names.BATCH_SIZE] == 3


# -- async functions and streams -----------------------------------------------------------------
def test_an_async_function_is_awaited_inside_its_span():
    @ci.inference
    async def predict(texts):
        await asyncio.sleep(0.01)
        with ci.scope("postprocess"):
            return [t.upper() for t in texts]

    assert asyncio.run(predict(["a", "b"])) == ["A", "B"]
    span = only()
    assert span["attributes"][ci_names.BATCH_SIZE] == 2
    assert span["duration_ns"] >= 10_000_000
    assert [c["name"] for c in span["children"]] == ["postprocess"]


def test_concurrent_async_calls_are_separate_spans():
    @ci.inference
    async def predict(x):
        await asyncio.sleep(0.01)
        return x

    async def main():
        return await asyncio.gather(*(predict([i]) for i in range(3)))

    assert asyncio.run(main()) == [[0], [1], [2]]
    assert len(spans()) == 3
    assert all(s["children"] == [] for s in spans())


def test_a_generator_is_one_span_until_it_is_exhausted_and_not_current_in_the_consumer():
    @ci.inference("stream")
    def stream(prompt):
        for word in prompt.split():
            with ci.scope("token"):
                yield word

    consumed = []
    for word in stream("the cat sat"):
        with ci.scope("consumer"):
            consumed.append(word)
    assert consumed == ["the", "cat", "sat"]
    span = only("stream")
    assert [c["name"] for c in span["children"]] == ["token", "token", "token"]
    root = ci.trace(format="dict")
    assert len(kids(root, "consumer")) == 3  # the consumer's code is not inside the stream
    first = span["attributes"][ci_names.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
    assert 0 <= first * 1e9 <= span["duration_ns"]


def test_a_generator_closed_early_ends_its_span_then():
    @ci.inference("stream")
    def stream():
        yield from range(100)

    for item in stream():
        if item == 2:
            break
    span = only("stream")
    assert span["end_ns"] is not None and span["status"] == "UNSET"


def test_an_async_generator_is_one_span_until_it_is_exhausted():
    @ci.inference("stream")
    async def stream(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    async def consume():
        return [item async for item in stream(4)]

    assert asyncio.run(consume()) == [0, 1, 2, 3]
    span = only("stream")
    assert span["end_ns"] is not None
    assert ci_names.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK in span["attributes"]


def test_a_generator_that_raises_ends_its_span_with_the_error():
    @ci.inference("stream")
    def stream():
        yield 1
        raise RuntimeError("stream broke")

    with pytest.raises(RuntimeError, match="stream broke"):
        list(stream())
    span = only("stream")
    assert span["status"] == "ERROR"
    assert span["attributes"][ci_names.ERROR_TYPE] == "RuntimeError"


def test_values_sent_and_returned_by_a_generator_pass_through():
    @ci.inference
    def echo():
        received = yield "ready"
        yield f"got {received}"
        return "done"

    def delegate():
        return (yield from echo())

    runner = delegate()
    assert next(runner) == "ready"
    assert runner.send("x") == "got x"
    with pytest.raises(StopIteration) as stop:
        next(runner)
    assert stop.value.value == "done"


# -- errors, nesting, no profiler --------------------------------------------------------------
def test_an_exception_keeps_its_error_status_and_reaches_the_caller_unchanged():
    class ModelError(Exception):
        pass

    error = ModelError("out of memory")

    @ci.inference
    def predict(x):
        raise error

    with pytest.raises(ModelError) as raised:
        predict([1, 2])
    assert raised.value is error
    span = only()
    assert span["status"] == "ERROR"
    assert span["attributes"][ci_names.ERROR_TYPE].endswith("ModelError")
    (event,) = span["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.message"] == "out of memory"


def test_it_nests_under_a_server_span_of_other_opentelemetry_instrumentation():
    ci.profile(output="none", frameworks=[], metrics=False)

    @ci.inference
    def predict(x):
        return x

    tracer = trace.get_tracer("opentelemetry.instrumentation.fastapi")
    with tracer.start_as_current_span("POST /predict", kind=SpanKind.SERVER) as server:
        predict([1])
    span = only()
    assert span["parent_id"] == format(server.get_span_context().span_id, "016x")


def test_without_a_profiler_spans_are_kept_in_memory_like_scopes():
    @ci.inference
    def predict(x):
        return x

    predict([1])
    assert ci.trace(format="dict")["name"] == "cirron.session"
    assert len(spans()) == 1


def test_disabled_profiling_passes_the_call_straight_through():
    ci.profile(enabled=False)

    @ci.inference
    def predict(x):
        return x * 2

    assert predict(21) == 42
    with ci.inference("block") as call:
        call.record_input([1])
        call.set_attribute("k", 1)
    assert ci.trace(format="dict") is None or spans() == []


def test_a_failure_inside_cirron_is_counted_and_the_call_goes_on(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("cirron bug")

    monkeypatch.setattr(calls, "start_attributes", broken)

    @ci.inference
    def predict(x):
        return x + 1

    assert predict(1) == 2
    health = ci.health()
    assert health["errors_by_site"].get(calls.SITE) == 1


def test_bad_arguments_are_precise_errors():
    with pytest.raises(TypeError, match="inference name"):
        ci.inference(3)
    with pytest.raises(ValueError, match="inference name"):
        ci.inference("")
    with pytest.raises(TypeError, match="attribute 'bad'"):
        ci.inference("x", bad=object())
