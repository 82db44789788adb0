"""Long runs: what a step costs on disk, and what reading a run of N steps costs.

A synthetic spool is written directly (not by training, so a million steps take seconds): the
spans a plain torch loop records, as cirron's spool holds them. Each step is a ``step`` span
with a ``loss`` mark and four children (``data_load``, ``forward``, ``backward``,
``optimizer_step``); epochs of 1,000 steps under one ``cirron.session``; a flush file per
2,000 steps; every 997th step five times slower (what the findings and charts must keep).
With ``ranks`` > 1, each rank is a process of one run (a run id, a rank each).

Each command runs in a subprocess of its own (``cirron runs``, ``show --diagnose``,
``report``, ``export --format chrome``), timed, with its peak resident memory (the
child's ``ru_maxrss``). The spool is written twice, compressed (the default) and plain
(``spool_compression="none"``, and no index: the format before them), and every command
reads both: the plain spool is the baseline row.

``python -m benchmarks.long_runs [--steps 10000,100000] [--ranks 1] [--timeout 600]``
prints the table; ``python -m benchmarks --only long_runs`` gives the 10k rows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from cirron.exporters import spool_index, step_rows

from .table import Row

STEPS_PER_EPOCH = 1000
STEPS_PER_FILE = 2000
STEP_NS = 2_000_000  # a 2 ms step
SLOW_EVERY = 997  # each such step takes five times as long
COMMANDS = {
    "runs": ["runs"],
    "show --diagnose": ["show", "--diagnose"],
    "report": ["report", "-o", "{out}/report.html"],
    "export chrome": ["export", "--format", "chrome", "-o", "{out}/trace.json"],
}
BIN = Path(sys.executable).parent


# -- the synthetic spool ---------------------------------------------------------------------
def _no_rows() -> dict[str, list[Any]]:
    return {key: [] for key in step_rows.COLUMNS}


def _attributes(pairs: dict[str, object]) -> str:
    out = []
    for key, value in pairs.items():
        if isinstance(value, str):
            encoded = f'{{"stringValue":"{value}"}}'
        elif isinstance(value, float):
            encoded = f'{{"doubleValue":{value!r}}}'
        elif isinstance(value, list):
            items = ",".join(f'{{"stringValue":"{item}"}}' for item in value)
            encoded = f'{{"arrayValue":{{"values":[{items}]}}}}'
        else:
            encoded = f'{{"intValue":"{value}"}}'
        out.append(f'{{"key":"{key}","value":{encoded}}}')
    return "[" + ",".join(out) + "]"


class _Process:
    """One process's spans, written a file per flush as cirron's spool has them."""

    def __init__(self, folder: Path, pid: int, rank: int | None, run_id: str, gzip: bool):
        self.folder, self.pid, self.gzip = folder, pid, gzip
        self.random = random.Random(pid)
        self.trace = f"{self.random.getrandbits(128):032x}"
        resource: dict[str, object] = {
            "telemetry.sdk.language": "python",
            "service.name": "train",
            "service.instance.id": f"instance-{pid}",
            "host.name": "bench",
            "process.pid": pid,
        }
        if rank is not None:
            resource |= {"cirron.rank": rank, "cirron.world_size": 0, "cirron.run_id": run_id}
        self.head = (
            '{"resourceSpans":[{"resource":{"attributes":'
            + _attributes(resource)
            + '},"scopeSpans":[{"scope":{"name":"cirron","version":"0.1.0"},"spans":[\n'
        )
        self.resource = resource
        self.lines: list[str] = []
        self.sequence = 0
        self.bytes = 0
        self.steps = 0  # of the file being written
        self.start: int | None = None
        self.end = 0
        self.sessions: list[dict[str, object]] = []
        self.names: dict[str, int] = {}
        self.rows: dict[str, list[Any]] = _no_rows()
        self.losses: list[list[Any]] = []

    def new_id(self) -> str:
        return f"{self.random.getrandbits(64):016x}"

    def span(self, span_id: str, parent: str | None, name: str, start: int, end: int,
             attributes: str = "[]", events: str = "") -> None:  # fmt: skip
        parent_field = f',"parentSpanId":"{parent}"' if parent else ""
        self.steps += name == "step"
        self.names[name] = self.names.get(name, 0) + 1
        self.start = start if self.start is None else min(self.start, start)
        self.end = max(self.end, end)
        if name == "cirron.session":
            self.sessions.append({"start": start, "trace": self.trace, "frameworks": ["torch"]})
        self.lines.append(
            f'{{"traceId":"{self.trace}","spanId":"{span_id}"{parent_field},"name":"{name}",'
            f'"kind":1,"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}",'
            f'"attributes":{attributes},"flags":257{events}}}'
        )

    def flush(self) -> None:
        if not self.lines:
            return
        self.sequence += 1
        data = (self.head + ",\n".join(self.lines) + "\n]}]}]}").encode("ascii")
        spans, self.lines = len(self.lines), []
        suffix = ".json"
        if self.gzip:
            deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
            data, suffix = deflate.compress(data) + deflate.flush(), ".json.gz"
        name = f"{self.pid}-{self.sequence:06d}{suffix}"
        (self.folder / name).write_bytes(data)
        self.bytes += len(data)
        if self.gzip:  # cirron writes the spool's index with it (the plain spool: as before)
            self._index(name, spans)
        self.steps, self.start, self.end, self.sessions, self.names = 0, None, 0, [], {}
        self.rows, self.losses = _no_rows(), []

    def row(self, step: str, parent: str, index: int, start: int, wall: int, parts: list[int],
            loss: float, loss_at: int) -> None:  # fmt: skip
        """A step's row in the index, as cirron's spool exporter folds it from the spans."""
        self.losses.append([len(self.rows["id"]), loss, loss_at])
        for key, value in (("id", int(step, 16)), ("parent", int(parent, 16)), ("kind", 0), ("index", index),
                           ("start", start), ("wall", wall), ("status", 0), ("waits", 1),
                           ("whole", 1),
                           *zip(step_rows.PARTS, parts, strict=True)):  # fmt: skip
            self.rows[key].append(value)

    def _index(self, name: str, spans: int) -> None:
        """The file's line in the spool's index and its steps' rows, as cirron's spool
        exporter writes them."""
        line = {
            "v": 1, "file": name, "spans": spans, "steps": self.steps, "batches": 0,
            "errors": 0, "start": self.start, "end": self.end, "first": [self.start, self.trace],
            "sessions": self.sessions, "names": self.names, "resource": self.resource,
        }  # fmt: skip
        index = self.folder.parent / "index"
        index.mkdir(exist_ok=True)
        if self.rows["id"]:
            rows = {
                "v": 1, "file": name, "resource": self.resource,
                "rows": step_rows.pack_rows(self.rows), "attributes": {},
                "marks": {"loss": step_rows.pack(self.losses, self.rows)},
                "traces": [[0, self.trace]],
            }  # fmt: skip
            deflate = zlib.compressobj(6, zlib.DEFLATED, 31)
            member = json.dumps(rows, separators=(",", ":")).encode() + b"\n"
            with open(index / f"{self.pid}{spool_index.STEPS_SUFFIX}", "ab") as stream:
                stream.write(deflate.compress(member) + deflate.flush())
        with open(index / f"{self.pid}.jsonl", "a") as stream:
            stream.write(json.dumps(line, separators=(",", ":")) + "\n")


def write_spool(path: Path, steps: int, ranks: int = 1, gzip: bool = True) -> int:
    """A cirron directory at ``path`` holding a run of ``steps`` steps a rank; its bytes."""
    folder = path / "spool"
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for rank in range(ranks):
        process = _Process(folder, 1000 + rank, rank if ranks > 1 else None, "bench-run", gzip)
        total += _write_process(process, steps, rank)
    return total


def _write_process(process: _Process, steps: int, rank: int) -> int:
    start = 1_700_000_000_000_000_000
    session = process.new_id()
    now = start + 1_000_000
    epoch_id, epoch_start, epoch_index = "", 0, 0
    for step in range(steps):
        if step % STEPS_PER_EPOCH == 0:
            epoch_id, epoch_start = process.new_id(), now
        took = STEP_NS * (5 if step % SLOW_EVERY == SLOW_EVERY - 1 else 1) + rank * 1000
        step_id = process.new_id()
        parts = (("data_load", 0.1), ("forward", 0.3), ("backward", 0.35), ("optimizer_step", 0.1))
        at = now
        for name, share in parts:
            took_part = int(took * share)
            process.span(process.new_id(), step_id, name, at, at + took_part)
            at += took_part
        loss = 2.0 / (1 + step / 1000) + process.random.random() * 0.01
        event = (
            f',"events":[{{"timeUnixNano":"{now + took - 1000}","name":"loss",'
            f'"attributes":[{{"key":"value","value":{{"doubleValue":{loss!r}}}}}]}}]'
        )
        process.span(
            step_id, epoch_id, "step", now, now + took, _attributes({"index": step}), event
        )
        timed = [int(took * share) for _name, share in parts]
        process.row(step_id, epoch_id, step, now, took, timed, loss, now + took - 1000)
        now += took
        if step % STEPS_PER_EPOCH == STEPS_PER_EPOCH - 1 or step == steps - 1:
            index = _attributes({"index": epoch_index})
            process.span(epoch_id, session, "epoch", epoch_start, now, index)
            epoch_index += 1
        if step % STEPS_PER_FILE == STEPS_PER_FILE - 1:
            process.flush()
    session_attributes = _attributes(
        {"framework": ["torch"], "device": "cpu", "cuda_count": 0, "mixed_precision": 0}
    )
    process.span(session, None, "cirron.session", start, now + 1_000_000, session_attributes)
    process.flush()
    return process.bytes


# -- the commands ----------------------------------------------------------------------------
def measure(command: list[str], path: Path, out: Path, timeout: float) -> tuple[float, float]:
    """(seconds, peak resident MB) of ``cirron COMMAND PATH``; (nan, nan) past ``timeout``."""
    arguments = [str(BIN / "cirron"), command[0], str(path)] + [
        part.format(out=out) for part in command[1:]
    ]
    started = time.perf_counter()
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = started + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            process.kill()
            os.wait4(process.pid, 0)
            return float("nan"), float("nan")
        time.sleep(0.01)
    took = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        error = process.stderr.read().decode() if process.stderr else ""
        raise RuntimeError(f"cirron {' '.join(command)} failed: {error[-2000:]}")
    return took, usage.ru_maxrss / 1024


def _slow_steps(steps: int) -> int:
    """The slow steps the findings name in one rank: an epoch's first step is warm-up."""
    slow = range(SLOW_EVERY - 1, steps, SLOW_EVERY)
    return sum(1 for step in slow if step % STEPS_PER_EPOCH)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_dom(page: Path, profile: Path, timeout: float = 600) -> str:
    """The DOM of ``page`` once Chromium (headless) has run its scripts: what a person sees."""
    assert CHROMIUM is not None, "needs Debian's chromium"
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--virtual-time-budget=15000", f"--user-data-dir={profile}", "--dump-dom",
    ]  # fmt: skip
    done = subprocess.run(
        [CHROMIUM, *flags, page.as_uri()], capture_output=True, text=True, timeout=timeout
    )
    return done.stdout


def slow_steps_drawn(report: Path, profile: Path) -> float:
    """How many slow steps the report's step chart draws as points of their own in Chromium,
    band and medians drawn too; nan without Chromium or without the band."""
    if CHROMIUM is None:
        return math.nan
    dom = chromium_dom(report, profile)
    chart = dom.split('id="step-times-chart"', 1)[-1].split('id="stalls-chart"', 1)[0]
    if "(lowest to highest)" not in chart or "(median)" not in chart or "slow steps" not in chart:
        return math.nan
    return float(len(re.findall(r'class="point"', chart)))


def measure_run(
    steps: int, ranks: int, timeout: float, baseline: bool = True
) -> dict[str, dict[str, float]]:
    """Per spool kind (``compressed``, and ``plain`` with ``baseline``): bytes a step, each
    command's seconds and peak MB, and the report's size in MB."""
    figures: dict[str, dict[str, float]] = {}
    commands = dict(COMMANDS)
    if ranks > 1:
        commands["show --ranks"] = ["show", "--ranks"]
    for kind in ("compressed", "plain") if baseline else ("compressed",):
        folder = Path(tempfile.mkdtemp(prefix=f"cirron-long-{kind}-"))
        try:
            path = folder / ".cirron"
            written = write_spool(path, steps, ranks, gzip=kind == "compressed")
            found = {"bytes a step": written / (steps * ranks), "slow steps": _slow_steps(steps)}
            for name, command in commands.items():
                seconds, peak = measure(command, path, folder, timeout)
                found[f"{name} s"], found[f"{name} MB"] = seconds, peak
            report = folder / "report.html"
            found["report size MB"] = report.stat().st_size / 2**20 if report.exists() else math.nan
            if kind == "compressed" and report.exists():  # (the baseline draws the same)
                found["slow steps drawn"] = slow_steps_drawn(report, folder / "chromium")
            figures[kind] = found
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return figures


def rows(steps: int, ranks: int, timeout: float, baseline: bool = True) -> list[Row]:
    """The figures of one size as rows of the benchmarks' table (ours, the plain spool's)."""
    figures = measure_run(steps, ranks, timeout, baseline)
    return _rows(steps, ranks, figures)


def _rows(steps: int, ranks: int, figures: dict[str, dict[str, float]]) -> list[Row]:
    ours, plain = figures["compressed"], figures.get("plain", {})
    what = f"{steps:,} steps" + (f" x {ranks} ranks" if ranks > 1 else "")
    out = [Row(f"{what}: spool bytes a step", ours["bytes a step"], "plain spool",
               plain.get("bytes a step"), unit="B")]  # fmt: skip
    for key in ours:
        if key.endswith(" s") or key.endswith(" MB"):
            name, _space, unit = key.rpartition(" ")
            label = f"{what}: {name}" + (", peak" if unit == "MB" and "size" not in name else "")
            out.append(Row(label, ours[key], "plain spool", plain.get(key), unit=unit))
    return out


def run(quick: bool = False) -> list[Row]:
    """The benchmark table's rows: a 10,000-step run (2,000 with ``quick``)."""
    return rows(2000 if quick else 10_000, 1, timeout=600)


# -- the growth table ------------------------------------------------------------------------
def growth_table(found: list[tuple[str, dict[str, float]]]) -> str:
    """A markdown table, a row per spool measured: bytes a step, and each command's seconds
    and peak memory (the report's size too)."""
    names = [key[:-2] for key in found[0][1] if key.endswith(" s")]
    header = ["run", "bytes a step"] + [f"`{name}`" for name in names]
    header += ["report size", "slow steps drawn in Chromium"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for label, figures in found:
        cells = [label, f"{figures['bytes a step']:,.0f}"]
        for name in names:
            seconds, peak = figures.get(f"{name} s", math.nan), figures.get(f"{name} MB", math.nan)
            cells.append("-" if math.isnan(seconds) else f"{seconds:.2f} s, {peak:,.0f} MB")
        size = figures.get("report size MB", math.nan)
        cells.append("-" if math.isnan(size) else f"{size:.1f} MB")
        drawn = figures.get("slow steps drawn", math.nan)
        slow = figures.get("slow steps", math.nan)
        cells.append("-" if math.isnan(drawn) else f"{drawn:,.0f} of {slow:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "long_runs.md"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long_runs")
    parser.add_argument("--steps", default="10000,100000,1000000", help="comma-separated steps")
    parser.add_argument("--ranks", type=int, default=1, help="processes of the run")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a command may take")
    parser.add_argument(
        "--baseline-up-to",
        type=int,
        default=100_000,
        help="steps (all ranks) up to which the plain spool is measured too: it is read whole, "
        "span by span, as before the index (a million steps would need about 9 GB)",
    )
    parser.add_argument("--write-docs", action="store_true", help=f"also write {DOC.name}")
    arguments = parser.parse_args(argv)
    found: list[tuple[str, dict[str, float]]] = []
    for steps in (int(text) for text in arguments.steps.split(",")):
        baseline = steps * arguments.ranks <= arguments.baseline_up_to
        figures = measure_run(steps, arguments.ranks, arguments.timeout, baseline)
        what = f"{steps:,} steps" + (f" x {arguments.ranks} ranks" if arguments.ranks > 1 else "")
        if "plain" in figures:
            found.append((f"{what}, baseline: plain spool, no index", figures["plain"]))
        found.append((what, figures["compressed"]))
        print(growth_table(found), flush=True)
    if arguments.write_docs:
        provenance = (
            f"Measured by `python -m benchmarks.long_runs --steps {arguments.steps} --ranks "
            f"{arguments.ranks}` on {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{datetime.date.today().isoformat()}, load average {os.getloadavg()[0]:.2f} at the end."
        )
        DOC.write_text(
            "<!-- Written by `python -m benchmarks.long_runs --write-docs`: do not edit by hand, "
            "run it again. -->\n\n" + provenance + "\n\n" + growth_table(found)
        )
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
