"""What inference spans may record of content: the ``capture`` setting, OpenTelemetry's GenAI
variable, the GenAI message form, the length limit, and secrets that are never recorded."""

from __future__ import annotations

import json
import logging

import pytest

import cirron as ci
from cirron.config import Capture
from cirron.inference import capture
from cirron.inference.redaction import REDACTED, redact
from cirron.otel import semconv, values

SECRETS = [
    "sk-proj-Zq8Xv2Lm4Np6Rt8Vw0Yb1234",  # OpenAI
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrSt",  # Anthropic
    "AKIAIOSFODNN7EXAMPLE",  # AWS access key id
    "ghp_" + "a1B2c3D4e5" * 4,  # GitHub
    "github_pat_11ABCDEFG0123456789_abcdefghij",
    "hf_" + "AbCdEfGhIj" * 4,  # Hugging Face
    "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",  # Google
    "xoxb-1234567890-abcdefghij",  # Slack
    "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",  # Stripe
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P",
]


# -- redaction ----------------------------------------------------------------------------------
@pytest.mark.parametrize("secret", SECRETS, ids=lambda s: s[:6])
def test_a_key_in_a_prompt_is_replaced_and_the_text_around_it_kept(secret):
    assert redact(f"my key is {secret}, please help") == f"my key is {REDACTED}, please help"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Authorization: Bearer abc.DEF-123_xyz", f"Authorization: Bearer {REDACTED}"),
        ("password=hunter2hunter2 then", f"password={REDACTED} then"),
        ('{"api_key": "zz9XyQw1234"}', f'{{"api_key": "{REDACTED}"}}'),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", REDACTED),
    ],
)
def test_a_token_after_its_keyword_is_replaced_and_the_keyword_kept(text, expected):
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text", ["the cat sat on the mat", "risk-free ask-me task-list", "sk-short", "AKIA is a word"]
)
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text


def test_a_key_at_the_edge_of_the_length_limit_is_never_half_recorded():
    cut = Capture(text=True, max_chars=20)
    text = "prefix " + SECRETS[0]
    assert capture.clean(text, cut) == ("prefix " + REDACTED)[:20]
    assert "Zq8" not in capture.clean(text, cut)


# -- the GenAI message form ---------------------------------------------------------------------
def test_messages_are_the_conventions_json_each_text_cut_to_max_chars():
    policy = Capture(text=True, max_chars=5)
    encoded = capture.messages_json([("user", "hello world"), ("system", "be brief")], policy)
    assert json.loads(encoded) == [
        {"role": "user", "parts": [{"type": "text", "content": "hello"}]},
        {"role": "system", "parts": [{"type": "text", "content": "be br"}]},
    ]
    replies = capture.messages_json([("assistant", "ok")], policy, ["length"])
    assert json.loads(replies)[0]["finish_reason"] == "length"


def test_messages_stay_valid_json_under_the_attribute_limit():
    policy = Capture(text=True, max_chars=100_000)
    encoded = capture.messages_json([("user", "x" * 50_000)] * 3, policy)
    assert len(encoded) <= values.MAX_VALUE_LENGTH
    assert {m["role"] for m in json.loads(encoded)} == {"user"}


# -- the setting --------------------------------------------------------------------------------
def resolved() -> Capture:
    profiler = ci.profile(output="none", frameworks=[], metrics=False)
    found = profiler.settings.capture
    ci.shutdown()
    assert found is not None
    return found


def test_nothing_is_captured_by_default():
    assert resolved() == Capture(text=False, tensors=False)


def test_capture_takes_a_dict_or_true():
    profiler = ci.profile(
        output="none", capture={"text": True, "tensors": "shapes", "max_chars": 10, "where": "both"}
    )
    assert profiler.settings.capture == Capture(True, True, 10, "both")
    ci.shutdown()
    assert ci.profile(output="none", config={"capture": True}).settings.capture == Capture(
        True, True
    )


@pytest.mark.parametrize(
    "value, error, words",
    [
        ({"txt": True}, ValueError, "did you mean 'text'"),
        ({"where": "log"}, ValueError, "span, event, both"),
        ({"text": "yes"}, TypeError, "capture['text']"),
        ({"max_chars": 0}, ValueError, "capture['max_chars']"),
        ("text", TypeError, "must be a dict"),
    ],
)
def test_a_bad_capture_is_a_precise_error(value, error, words):
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        ci.profile(output="none", capture=value)


def test_the_cirron_variable_sets_it(monkeypatch):
    monkeypatch.setenv("CIRRON_CAPTURE", "text,shapes,max_chars=64,where=event")
    assert resolved() == Capture(True, True, 64, "event")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("true", Capture(text=True)),
        ("SPAN_ONLY", Capture(text=True)),
        ("EVENT_ONLY", Capture(text=True, where="event")),
        ("span_and_event", Capture(text=True, where="both")),
        ("false", Capture()),
        ("NO_CONTENT", Capture()),
    ],
)
def test_the_opentelemetry_genai_variable_turns_text_on(monkeypatch, value, expected):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
    assert resolved() == expected


def test_a_bad_opentelemetry_value_warns_and_captures_nothing(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "maybe-later")
    with caplog.at_level(logging.WARNING, logger="cirron"):
        assert resolved() == Capture()
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in caplog.text


def test_the_argument_wins_over_the_variables(monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    monkeypatch.setenv("CIRRON_CAPTURE", "tensors")
    assert resolved() == Capture(tensors=True)  # CIRRON_CAPTURE over OpenTelemetry's
    profiler = ci.profile(output="none", capture=False)
    assert profiler.settings.capture == Capture()


# -- ci.inference with capture ---------------------------------------------------------------------
def summarize(text):
    return text[:12]


def test_an_inference_function_records_no_text_by_default():
    ci.profile(output="none", metrics=False)
    ci.inference(summarize)("the quarterly numbers are " + SECRETS[0])
    (span,) = ci.trace(format="dict", name="inference")
    assert not any(key.startswith("gen_ai.") for key in span["attributes"])
    assert SECRETS[0] not in json.dumps(ci.trace(format="dict"))


def test_an_inference_function_records_its_text_when_asked_with_secrets_redacted():
    ci.profile(output="none", metrics=False, capture={"text": True})
    ci.inference(summarize)("the key " + SECRETS[2] + " leaked")
    (span,) = ci.trace(format="dict", name="inference")
    (prompt,) = json.loads(span["attributes"][semconv.GEN_AI_INPUT_MESSAGES])
    assert prompt["parts"][0]["content"] == f"the key {REDACTED} leaked"
    (reply,) = json.loads(span["attributes"][semconv.GEN_AI_OUTPUT_MESSAGES])
    assert reply["parts"][0]["content"] == "the key AKIA"  # what the function returned
    assert reply["finish_reason"] == "stop"


def test_a_stream_records_its_whole_text_as_one_completion():
    ci.profile(output="none", metrics=False, capture={"text": True, "where": "event"})

    @ci.inference("stream")
    def stream(prompt):
        yield "to use it, send "
        yield SECRETS[0][:10]
        yield SECRETS[0][10:]

    assert len(list(stream("how?"))) == 3
    (span,) = ci.trace(format="dict", name="stream")
    (event,) = span["events"]
    assert event["name"] == semconv.GEN_AI_OPERATION_DETAILS
    (reply,) = json.loads(event["attributes"][semconv.GEN_AI_OUTPUT_MESSAGES])
    assert reply["parts"][0]["content"] == f"to use it, send {REDACTED}"  # split key, redacted


def test_shapes_only_records_the_shapes_and_no_text():
    np = pytest.importorskip("numpy")
    ci.profile(output="none", metrics=False, capture={"tensors": "shapes"})
    ci.inference(lambda x: x.sum(axis=1))(np.ones((4, 3)))
    (span,) = ci.trace(format="dict", name="inference")
    assert span["attributes"][semconv.INPUT_SHAPE] == [4, 3]
    assert span["attributes"][semconv.OUTPUT_SHAPE] == [4]
    assert semconv.GEN_AI_INPUT_MESSAGES not in span["attributes"]
