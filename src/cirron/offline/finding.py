"""A finding: what the findings engine (:mod:`cirron.offline.findings`) says about a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..exporters.lines import format_duration
from .steps import Step

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)
SHOWN = 5  # steps named in one sentence


@dataclass
class Finding:
    severity: str  # error, warning or info
    text: str  # one sentence, plain words
    action: str  # what to do next, one concrete thing ("" when nothing needs doing)
    chart: str  # the id of the report's chart it refers to
    figures: dict[str, Any] = field(default_factory=dict)
    span_ids: list[str] = field(default_factory=list)


def ms(ns: float) -> str:
    return format_duration(int(ns))


def steps_named(steps: list[Step]) -> str:
    shown = ", ".join(str(step.number) for step in steps[:SHOWN])
    return shown + (f" and {len(steps) - SHOWN} more" if len(steps) > SHOWN else "")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")
