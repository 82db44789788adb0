"""The findings about a process's steps: skipped optimizer steps, the wait for data, slow
steps and long gaps between steps (see :mod:`cirron.offline.findings`)."""

from __future__ import annotations

import statistics
from typing import Any

from ..exporters.lines import format_value
from ..otel import semconv
from .finding import INFO, SHOWN, WARNING, Finding, ms, plural, steps_named
from .steps import Timeline, duration_ns, span_id

INPUT_BOUND = 0.2  # this share of step time waiting for data or more: input-bound
SLOW_FACTOR = 3.0  # a step slower than this many times the median is slow
SLOW_MIN_NS = 1_000_000  # ... and at least 1 ms slower (a hiccup of a 2 us step is noise)
GAP_FACTOR = 10.0  # a gap between steps longer than this many median steps is long ...
GAP_MIN_NS = 50_000_000  # ... and longer than 50 ms
TENSORFLOW = "tensorflow"  # the session's framework name for Keras on TensorFlow


# -- steps --------------------------------------------------------------------------------------
def skipped_steps(who: str, timeline: Timeline) -> list[Finding]:
    skipped = [s for s in timeline.steps if (s.span.attributes or {}).get(semconv.SKIPPED)]
    if not skipped:
        return []
    scale = (skipped[-1].span.attributes or {}).get(semconv.LOSS_SCALE)
    early = skipped[-1].number < 20 and len(skipped) <= 10
    return [
        Finding(
            INFO if early else WARNING,
            f"{who}the AMP GradScaler skipped {len(skipped)} of {len(timeline.steps)} optimizer "
            f"steps (the first at step {skipped[0].number}, the last at step "
            f"{skipped[-1].number}"
            + (f", loss scale {format_value(scale)} then" if scale is not None else "")
            + ").",
            "nothing to do: the scale settles in the first steps"
            if early
            else "the gradients keep overflowing: look for inf/NaN in the loss or gradients "
            "(`ci.watch(model)`) and lower the learning rate",
            "step-times",
            {
                "skipped_steps": len(skipped),
                "first": skipped[0].number,
                "last": skipped[-1].number,
                "scale": scale,
            },
            [span_id(s.span) for s in skipped[:SHOWN]],
        )
    ]


def input_share(who: str, timeline: Timeline, frameworks: list[str]) -> list[Finding]:
    steps = timeline.steps
    if not steps:
        return []
    if not any(timeline.measures_waiting(step) for step in steps):
        return [
            Finding(
                INFO,
                f"{who}the wait for data is not recorded in this run (its steps hold no "
                f"{semconv.DATA_LOAD} spans), so whether it is input-bound is not known.",
                "the TensorFlow Profiler (tf.profiler.experimental.start) has an "
                "input-pipeline analysis"
                if TENSORFLOW in frameworks
                else f"iterate a torch DataLoader (its fetches are timed), or wrap the fetch "
                f'of each batch in `with ci.scope("{semconv.DATA_LOAD}"):`',
                "stalls",
            )
        ]
    wall = sum(step.wall_ns for step in steps)
    waiting = sum(timeline.waiting_ns(step) for step in steps)
    share = waiting / wall if wall else 0.0
    median = statistics.median(step.wall_ns for step in steps)
    figures = {"share": share, "waiting_ns": waiting, "wall_ns": wall, "step_count": len(steps)}
    said = (
        f"{who}{share:.0%} of step time is spent waiting for data "
        f"({len(steps)} steps, median step {ms(median)})"
    )
    if share >= INPUT_BOUND:
        return [
            Finding(
                WARNING,
                said + ": the run is input-bound.",
                "feed the loop faster: more DataLoader workers (num_workers), pin_memory=True "
                "when training on a GPU, persistent_workers=True and a larger prefetch_factor",
                "stalls",
                figures,
            )
        ]
    return [Finding(INFO, said + ": the run is not input-bound.", "", "stalls", figures)]


def slow_steps(who: str, timeline: Timeline) -> list[Finding]:
    counted = [s for s in timeline.steps if s.number > 0 and not s.first_of_epoch]
    if len(counted) < 5:
        return []
    median = statistics.median(step.wall_ns for step in counted)
    slow = [
        step
        for step in counted
        if step.wall_ns > SLOW_FACTOR * median and step.wall_ns - median > SLOW_MIN_NS
    ]
    if not slow:
        return []
    slowest = max(slow, key=lambda s: s.wall_ns)
    lost = sum(step.wall_ns - median for step in slow)
    wall = sum(step.wall_ns for step in timeline.steps)
    which = (
        f"step {slowest.number}, {ms(slowest.wall_ns)}"
        if len(slow) == 1
        else f"steps {steps_named(slow)}; the slowest, step {slowest.number}, took "
        f"{ms(slowest.wall_ns)}"
    )
    return [
        Finding(
            # Worth a look when they cost a tenth of the run's step time.
            WARNING if lost > 0.1 * wall and len(counted) >= 20 else INFO,
            f"{who}{plural(len(slow), 'step')} took more than {SLOW_FACTOR:g}x the median step "
            f"({ms(median)}): {which}. The first step of the run and of each epoch are warm-up "
            "and not counted.",
            f"open the slowest (span {span_id(slowest.span)}) and compare its parts with a "
            "normal step's: a data_load is a slow batch, a long `other` is work outside the "
            "hooks (logging, a sync, garbage collection)",
            "step-times",
            {
                "slow": len(slow),
                "median_ns": median,
                "lost_ns": lost,
                "slow_steps": [s.number for s in slow],
            },
            [span_id(s.span) for s in slow[:SHOWN]],
        )
    ]


def gaps(who: str, timeline: Timeline) -> list[Finding]:
    steps = timeline.steps
    if len(steps) < 2:
        return []
    median = statistics.median(step.wall_ns for step in steps)
    threshold = max(GAP_FACTOR * median, GAP_MIN_NS)
    gaps = []
    for before, after in zip(steps, steps[1:], strict=False):
        gap = after.span.start_time - before.span.end_time
        if gap > threshold:
            ran, covered = _what_ran(timeline, before.span.end_time, after.span.start_time)
            gaps.append((gap, before, after, ran, covered >= gap / 2))
    if not gaps:
        return []
    gaps.sort(key=lambda g: g[0], reverse=True)
    described = [
        f"{ms(gap)} between steps {before.number} and {after.number} ("
        + (", ".join(ran) if explained else "nothing recorded: a stall")
        + ")"
        for gap, before, after, ran, explained in gaps[:3]
    ]
    stalls = sum(1 for *_rest, explained in gaps if not explained)
    return [
        Finding(
            WARNING if stalls else INFO,
            f"{who}{plural(len(gaps), 'long gap')} between steps: " + "; ".join(described) + ".",
            "a stall with nothing recorded is work outside any hook: wrap it in "
            "`ci.scope(...)` to see it"
            if stalls
            else "evaluation and checkpoints between steps are expected; make them rarer if "
            "they cost too much",
            "step-times",
            {"gaps": len(gaps), "stalls": stalls, "longest_ns": gaps[0][0]},
            [span_id(g[1].span) for g in gaps[:SHOWN]],
        )
    ]


def _what_ran(timeline: Timeline, start: int, end: int) -> tuple[list[str], int]:
    """The outermost spans that ran within [start, end] (the longest first, with their
    durations), and the nanoseconds they cover."""
    outer: list[Any] = []
    for span in timeline.started_within(start, end):  # an outer span before what it holds
        if span.end_time is None or span.end_time > end:
            continue
        if any(o.start_time <= span.start_time and span.end_time <= o.end_time for o in outer):
            continue
        outer.append(span)
    outer.sort(key=duration_ns, reverse=True)
    named = [f"{span.name} {ms(duration_ns(span))}" for span in outer[:4]]
    return named, sum(duration_ns(span) for span in outer)
