"""Hook spans (forward, backward, optimizer_step, data_load) are noted as timestamps and built
later; every trace must look as if they had been open all along."""

from __future__ import annotations

import signal
import sys
import textwrap

import pytest
from tests.support import Script, attribute, children, is_error, named, status

import cirron as ci

torch = pytest.importorskip("torch")


class Tagged(torch.nn.Module):
    """A model whose forward makes a scope and a mark of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x):  # noqa: ANN001, ANN201
        ci.mark("batch_mean", float(x.mean()))
        with ci.scope("inside"):
            return self.linear(x)


def _train(model, steps: int = 3, fail_at: int | None = None) -> None:  # noqa: ANN001
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(4 * steps, 4), torch.randn(4 * steps, 1))
    for index, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=4)):
        if index == fail_at:
            x = x[:, :3]  # the wrong width: the forward raises
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _step_children(step: dict) -> list[str]:
    return [child["name"] for child in step["children"]]


def test_a_scope_and_a_mark_inside_a_forward_land_in_that_forward():
    ci.profile(output="none")
    _train(Tagged())
    steps = ci.trace(format="dict", name="step")
    assert len(steps) == 3
    for step in steps:
        assert _step_children(step) == ["data_load", "forward", "backward", "optimizer_step"]
        forward = step["children"][1]
        assert [child["name"] for child in forward["children"]] == ["inside"]
        assert [mark["name"] for mark in forward["marks"]] == ["batch_mean"]
        inside = forward["children"][0]
        assert forward["start_ns"] <= inside["start_ns"] <= inside["end_ns"] <= forward["end_ns"]


def test_hook_spans_have_the_times_of_the_calls_in_order():
    ci.profile(output="none")
    _train(torch.nn.Linear(4, 1))
    for step in ci.trace(format="dict", name="step"):
        spans = step["children"]
        assert _step_children(step) == ["data_load", "forward", "backward", "optimizer_step"]
        for earlier, later in zip(spans, spans[1:], strict=False):
            assert earlier["end_ns"] <= later["start_ns"]
        assert step["start_ns"] <= spans[0]["start_ns"]
        assert spans[-1]["end_ns"] <= step["end_ns"]
        assert spans[1]["attributes"] == {"mode": "train", "module": "Linear"}


def test_a_forward_that_raises_is_an_error_span_and_the_error_reaches_the_user():
    ci.profile(output="none")
    with pytest.raises(RuntimeError):
        _train(torch.nn.Linear(4, 1), steps=3, fail_at=1)
    forwards = ci.trace(format="dict", name="forward")
    assert len(forwards) == 2
    failed = forwards[1]
    assert failed["status"] == "ERROR"
    assert [event["name"] for event in failed["events"]] == ["exception"]
    assert forwards[0]["status"] != "ERROR"
    assert ci.health()["hook_errors"] == 0


def test_another_instrumentations_span_inside_a_forward_is_a_child_of_the_step():
    from opentelemetry import trace

    ci.profile(output="none")
    tracer = trace.get_tracer("someone-else")

    class Traced(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x):  # noqa: ANN001, ANN201
            with tracer.start_as_current_span("their_span"):
                return self.linear(x)

    _train(Traced(), steps=1)
    (step,) = ci.trace(format="dict", name="step")
    names = _step_children(step)
    assert names == ["data_load", "forward", "their_span", "backward", "optimizer_step"]


def test_ci_trace_and_health_right_after_a_step_count_its_hook_spans():
    ci.profile(output="none")
    _train(torch.nn.Linear(4, 1), steps=1)
    assert len(ci.trace(format="dict", name="forward")) == 1
    health = ci.health()
    # The step, its four hook spans and the fetch that found the loader empty have ended;
    # the session and the epoch are open.
    assert (health["spans_started"], health["spans_ended"]) == (8, 6)


def test_the_spool_gets_every_hook_span_once(tmp_path):
    ci.profile(path=str(tmp_path))
    _train(torch.nn.Linear(4, 1), steps=5)
    ci.shutdown()
    spans = ci.spool_spans(str(tmp_path))
    steps = named(spans, "step")
    assert len(steps) == 5
    for step in steps:
        for name in ("data_load", "forward", "backward", "optimizer_step"):
            assert len(children(spans, step, name)) == 1
    assert len({span["spanId"] for span in spans}) == len(spans)


_SLOW_FORWARD = textwrap.dedent(
    """
    import sys, time, torch
    import cirron as ci

    ci.profile(path=sys.argv[1])

    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x):
            if self.calls == 2:
                print("in the forward", flush=True)
                time.sleep(30)
            self.calls += 1
            return self.linear(x)

    model = Slow()
    model.calls = 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(4, 4)).sum().backward()
        optimizer.step()
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_during_a_forward_keeps_its_span_with_the_signal(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(_SLOW_FORWARD)
    out = tmp_path / "out"
    with Script(script, str(out), cwd=tmp_path) as running:
        running.wait_for("in the forward")
        running.send(signal.SIGTERM)
        code, _stdout, stderr = running.finish()
    assert code == -signal.SIGTERM, stderr
    spans = ci.spool_spans(str(out))
    forwards = named(spans, "forward")
    assert len(forwards) == 3  # two finished, and the one the signal cut short
    cut = [span for span in forwards if is_error(span)]
    assert len(cut) == 1
    assert "SIGTERM" in status(cut[0])["message"]
    assert attribute(cut[0], "mode") == "train"
    assert len(named(spans, "backward")) == 2
    (step,) = [span for span in named(spans, "step") if is_error(span)]
    assert children(spans, step, "forward") == cut
