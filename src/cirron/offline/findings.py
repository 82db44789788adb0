"""The findings about a run: what went wrong or is slow, in plain words, with what to do next.

One engine for ``cirron show --diagnose``, the report and the notebook view. Each finding
names its severity, says one sentence, keeps the figures behind it and the ids of the spans
it is about, and proposes one concrete action. Every figure is read from the run's spans:

- **failed**: a span with status ERROR (the run's, or one the run went on after), the
  exception's type and message, and the step it happened in;
- **non-finite**: a mark (``loss``, ...) that became NaN or infinite, from which step, how often;
- **skipped**: optimizer steps the AMP GradScaler skipped, and its loss scale;
- **input**: the share of step wall time spent waiting for data on the training thread
  (the ``data_load`` inside each step over the steps' wall time: steps abut, one per thread);
- **slow steps**: steps over 3x the median, the first step of the run and of each epoch left
  out as warm-up;
- **loss**: a loss that did not decrease;
- **gaps**: long gaps between steps, and what ran in them (evaluation, checkpoints, nothing);
- **memory creep**: host memory, or the device memory's step peak, growing from epoch to
  epoch (:mod:`cirron.offline.resource_findings`);
- **CPU competition**: the training thread waiting for a CPU that another process or thread
  held (its run delay) for much of its steps' time: the machine, not the model, was slow
  (:mod:`cirron.offline.resource_findings`);
- **ranks**: the rank the others wait for, and ranks that recorded fewer steps
  (:mod:`cirron.offline.rank_findings`);
- **snapshots**: the first snapshot with NaN or Inf values.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..exporters.lines import format_value
from ..otel import semconv
from . import rank_findings, resource_findings, step_findings
from .finding import ERROR, INFO, SEVERITIES, WARNING, Finding, plural
from .runs import Process, Run
from .steps import Timeline, is_error, span_id

NOT_TRAINING_LOSS = ("val", "eval", "test", "epoch")  # mark names of other losses begin so


def diagnose(run: Run) -> list[Finding]:
    """The findings about ``run``, errors first."""
    timelines = [(process, process.timeline()) for process in run.processes]
    several = len(run.processes) > 1
    findings: list[Finding] = []
    for process, timeline in timelines:
        who = f"{process.label}: " if several else ""
        marks = _point_marks(timeline)  # (read once for both: a million steps take seconds)
        non_finite, loss = _non_finite_marks(who, timeline, marks), _loss_trend(who, marks)
        del marks
        findings += _failures(who, timeline)
        findings += non_finite
        findings += step_findings.skipped_steps(who, timeline)
        findings += step_findings.input_share(who, timeline, run.frameworks)
        findings += step_findings.slow_steps(who, timeline)
        findings += loss
        findings += step_findings.gaps(who, timeline)
        findings += resource_findings.memory_creep(who, timeline)
        findings += resource_findings.cpu_competition(who, timeline)
    findings += rank_findings.rank_findings(run)
    findings += _snapshots(timelines)
    if not any(timeline.steps for _process, timeline in timelines):
        findings.append(Finding(INFO, "No steps were recorded in this run.", "", "step-times"))
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


# -- failures -----------------------------------------------------------------------------------
def _exception(span: Any) -> tuple[str, str] | None:
    for event in span.events:
        if event.name == semconv.EXCEPTION:
            attributes = event.attributes or {}
            return (
                str(attributes.get(semconv.EXCEPTION_TYPE, "?")),
                str(attributes.get(semconv.EXCEPTION_MESSAGE, "")),
            )
    return None


def _raised_at(span: Any) -> int:
    """When ``span``'s error was raised: its exception event's time, else its end."""
    for event in span.events:
        if event.name == semconv.EXCEPTION and event.timestamp:
            return int(event.timestamp)
    return int(span.end_time or span.start_time)


def _failures(who: str, timeline: Timeline) -> list[Finding]:
    failed = [span for span in timeline.spans if is_error(span)]
    if not failed:
        return []
    # Where it was raised: the deepest failed span holding an exception (an exception that
    # escapes closes every span around it with the same event), else the earliest.
    raised = [span for span in failed if _exception(span) is not None]
    depth = {id(span): _depth(timeline, span) for span in failed}
    origin = max(raised or failed, key=lambda s: (depth[id(s)], -s.start_time))
    kind, message = _exception(origin) or ("", origin.status.description or "")
    # When it was raised: an epoch that failed began with its first step, not at the error.
    raised_at = _raised_at(origin)
    step = timeline.step_at(origin, raised_at)
    if step is not None:
        where = f"`{origin.name}` of step {step.number}"
    else:  # between steps (the next one's batch fetched, no work on it yet)
        before = [s for s in timeline.steps if s.span.start_time <= raised_at]
        where = f"`{origin.name}`" + (f" after step {before[-1].number}" if before else "")
    what = f"{kind}: {message}" if kind else (message or "status ERROR")
    run_failed = any(s.name in (semconv.SESSION, semconv.TRAIN) for s in failed) or (
        not any(s.name == semconv.SESSION for s in timeline.spans)
    )
    figures = {
        "exception_type": kind,
        "message": message,
        "span": origin.name,
        "in_step": step.number if step is not None else None,
        "failed_spans": len(failed),
    }
    ids = [span_id(origin)] + ([span_id(step.span)] if step is not None else [])
    if run_failed:
        return [
            Finding(
                ERROR,
                f"{who}the run failed in {where}: {what}.",
                f"open span {span_id(origin)} (`cirron show --name {origin.name}`): its "
                "exception event holds the traceback",
                "step-times",
                figures,
                ids,
            )
        ]
    return [
        Finding(
            WARNING,
            f"{who}{plural(len(failed), 'span')} ended in an error and the run went on; the first "
            f"raised in {where}: {what}.",
            f"open span {span_id(origin)} to see the traceback; the run caught this error",
            "step-times",
            figures,
            ids,
        )
    ]


def _depth(timeline: Timeline, span: Any) -> int:
    depth, above = 0, timeline.parent(span)
    while above is not None:
        depth, above = depth + 1, timeline.parent(above)
    return depth


# -- marks --------------------------------------------------------------------------------------
def _point_marks(timeline: Timeline) -> dict[str, list[tuple[Any, Any, int]]]:
    """name -> [(span, value, time_ns)] of every numeric point mark, in time order."""
    marks: dict[str, list[tuple[Any, Any, int]]] = {}
    for span in timeline.spans:
        for event in span.events:
            value = (event.attributes or {}).get(semconv.MARK_VALUE)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                marks.setdefault(event.name, []).append((span, value, event.timestamp))
    for series in marks.values():
        series.sort(key=lambda item: item[2])
    return marks


def _summary_marks(timeline: Timeline) -> dict[str, list[tuple[Any, Any]]]:
    """name -> [(span, value)] of every numeric summary mark, in start order."""
    marks: dict[str, list[tuple[Any, Any]]] = {}
    for span in timeline.spans:
        for key, value in (span.attributes or {}).items():
            if key.startswith(semconv.MARK_PREFIX) and isinstance(value, (int, float)):
                if not isinstance(value, bool):
                    marks.setdefault(key[len(semconv.MARK_PREFIX) :], []).append((span, value))
    return marks


def _where(timeline: Timeline, span: Any, time_ns: int) -> str:
    step = timeline.step_at(span, time_ns)
    if step is not None:
        return f"step {step.number}"
    index = (span.attributes or {}).get(semconv.INDEX)
    return f"{span.name} {index}" if index is not None else f"`{span.name}`"


def _non_finite_marks(
    who: str, timeline: Timeline, marks: dict[str, list[tuple[Any, Any, int]]]
) -> list[Finding]:
    """``marks``: the timeline's point marks (:func:`_point_marks`)."""
    findings = []
    series: dict[str, list[tuple[Any, Any, int]]] = dict(marks)
    for name, summary in _summary_marks(timeline).items():
        series[name] = series.get(name, []) + [
            (span, value, span.start_time) for span, value in summary
        ]
    for name, values in sorted(series.items()):
        bad = [(span, value, time) for span, value, time in values if not math.isfinite(value)]
        if not bad:
            continue
        span, value, time = bad[0]
        where = _where(timeline, span, time)
        findings.append(
            Finding(
                ERROR if "loss" in name else WARNING,
                f"{who}{name} became {format_value(value)} at {where}: {len(bad)} of its "
                f"{len(values)} values are not finite.",
                "look at the step before: a learning rate too high, a division by zero or a "
                "log of 0 in the loss; `ci.watch(model)` shows which weights went first",
                "marks",
                {"mark": name, "first": where, "non_finite": len(bad), "values": len(values)},
                [span_id(span)],
            )
        )
    return findings


def _loss_name(names: list[str]) -> str | None:
    candidates = [n for n in names if "loss" in n and not n.startswith(NOT_TRAINING_LOSS)]
    if "loss" in candidates:
        return "loss"
    return candidates[0] if candidates else None


def loss_series(timeline: Timeline) -> tuple[str, list[float]] | None:
    """The training loss mark's name and its finite values in time order; None: no loss mark."""
    return _loss_in(_point_marks(timeline))


def _loss_in(marks: dict[str, list[tuple[Any, Any, int]]]) -> tuple[str, list[float]] | None:
    name = _loss_name(sorted(marks))
    if name is None:
        return None
    return name, [float(value) for _span, value, _time in marks[name] if math.isfinite(value)]


def _loss_trend(who: str, marks: dict[str, list[tuple[Any, Any, int]]]) -> list[Finding]:
    found = _loss_in(marks)
    if found is None:
        return []
    name, values = found
    if len(values) < 20:
        return []
    quarter = len(values) // 4
    first, last = statistics.fmean(values[:quarter]), statistics.fmean(values[-quarter:])
    if last < first - 0.02 * abs(first):
        return []
    return [
        Finding(
            WARNING,
            f"{who}{name} did not decrease: its mean was {format_value(first)} over the first "
            f"quarter of its {len(values)} values and {format_value(last)} over the last.",
            "check the learning rate (too low, or too high and diverging) and that the "
            "optimizer holds the model's parameters and zero_grad() runs each step",
            "marks",
            {"mark": name, "first_quarter": first, "last_quarter": last, "values": len(values)},
        )
    ]


# -- across processes ---------------------------------------------------------------------------
def _snapshots(timelines: list[tuple[Process, Timeline]]) -> list[Finding]:
    found = []
    any_snapshot = False
    for process, timeline in timelines:
        for span in timeline.spans:
            if span.name != semconv.SNAPSHOT:
                continue
            any_snapshot = True
            epoch = timeline.enclosing(span, semconv.EPOCH)
            index = (epoch.attributes or {}).get(semconv.INDEX) if epoch is not None else None
            for event in span.events:
                attributes = event.attributes or {}
                if attributes.get(semconv.NAN_COUNT, 0) or attributes.get(semconv.INF_COUNT, 0):
                    found.append((index if index is not None else -1, event.name, process, span))
                    break
    if found:
        index, tensor, process, span = min(found, key=lambda f: f[0])
        who = f"{process.label}: " if len(timelines) > 1 else ""  # as every finding names it
        return [
            Finding(
                ERROR,
                f"{who}the snapshot of epoch {index} is the first with NaN or Inf "
                f"values (first: {tensor}).",
                "look at the steps of that epoch: the loss and the learning rate there",
                "norms",
                {"snapshot_epoch": index, "tensor": tensor},
                [span_id(span)],
            )
        ]
    if any_snapshot:
        return [Finding(INFO, "No snapshot holds NaN or Inf values.", "", "norms")]
    return []
