"""Helpers for tests that need a fresh interpreter, and for reading what it spooled."""

from __future__ import annotations

import collections
import gzip
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path
from typing import Any


def run_python(
    code: str, *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (fresh globals, fresh OTel provider)."""
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CIRRON_", "OTEL_")) and k != "TRACEPARENT"
    }
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without OTEL_*/CIRRON_* (no stray endpoint or path)."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "CIRRON_", "TRACEPARENT", "TRACESTATE"))
    }
    environment.update(extra)
    return environment


class Script:
    """A script running as a subprocess, its output read as it comes; always killed on exit."""

    def __init__(self, script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=cwd,
            env=env if env is not None else clean_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(
                target=self._read, args=(self.process.stdout, self.out, True), daemon=True
            ),
            threading.Thread(
                target=self._read, args=(self.process.stderr, self.err, False), daemon=True
            ),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, into: list[str], announce: bool) -> None:
        for line in stream:
            into.append(line)
            if announce:
                self.lines.put(line)

    def __enter__(self) -> Script:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"no {text!r} from the script within {timeout}s; "
                    f"stdout={''.join(self.out)!r} stderr={''.join(self.err)[-2000:]!r}"
                )
            try:
                line = self.lines.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    for reader in self._readers:
                        reader.join(timeout=5)
                    if any(text in seen for seen in self.out):
                        return
                    raise AssertionError(
                        f"script exited ({self.process.returncode}) before {text!r}; "
                        f"stdout={''.join(self.out)!r} stderr={''.join(self.err)[-2000:]!r}"
                    ) from None
                continue
            if text in line:
                return

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = 20.0) -> tuple[int, str, str]:
        """Wait for the exit; returns (returncode, stdout, stderr)."""
        self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        return self.process.returncode, "".join(self.out), "".join(self.err)


def cirron(*arguments: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The ``cirron`` command of this interpreter's environment, run in ``cwd`` as a user would."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "cirron"), *arguments],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_script(
    script: Path,
    *args: str,
    cwd: Path,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    launcher: tuple[str, ...] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` to its end in a clean environment; returns the completed process.

    ``launcher``: what runs it (default: this Python), e.g. torchrun and its options.
    """
    return subprocess.run(
        [*(launcher or (sys.executable,)), str(script), *args],
        cwd=cwd,
        env=env if env is not None else clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# Spool files, compressed (.json.gz, the default) or not (.json).
SPOOL_FILES = "*-*.json*"


def spool_text(name: Path) -> str:
    """A spool file's OTLP/JSON text, gzip-compressed or not."""
    data = name.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("utf-8")


def spool_pids(path: Path) -> set[int]:
    return {int(name.name.partition("-")[0]) for name in (path / "spool").glob(SPOOL_FILES)}


def attribute(span: dict[str, Any], key: str) -> Any:
    for item in span.get("attributes", []):
        if item["key"] == key:
            ((kind, value),) = item["value"].items()
            return int(value) if kind == "intValue" else value
    return None


def status(span: dict[str, Any]) -> dict[str, Any]:
    return span.get("status", {})


def is_error(span: dict[str, Any]) -> bool:
    return status(span).get("code") == 2


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


def children(spans: list[dict[str, Any]], parent: dict[str, Any], name: str) -> list[dict]:
    return [s for s in spans if s["name"] == name and s.get("parentSpanId") == parent["spanId"]]


def assert_consistent(spans: list[dict[str, Any]]) -> None:
    """One tree: unique span ids, every parent present, every span ended."""
    ids = collections.Counter(span["spanId"] for span in spans)
    assert [i for i, n in ids.items() if n > 1] == [], "a span was exported twice"
    for span in spans:
        parent = span.get("parentSpanId")
        assert parent is None or parent in ids, f"{span['name']}: parent {parent} missing"
        assert int(span["endTimeUnixNano"]) >= int(span["startTimeUnixNano"]) > 0


def duplicate_span_ids(root: Path) -> dict[str, list[str]]:
    """Span ids found twice in one spool directory under ``root`` (by directory).

    Ids are unique across runs and processes, so a spool that several runs or
    a forked child wrote into still has each span id once. A file that is not
    valid JSON is some test's deliberate damage, checked by that test.
    """
    import json

    found: dict[str, list[str]] = {}
    for spool in {name.parent for name in root.rglob("spool/" + SPOOL_FILES)}:
        counts: collections.Counter[str] = collections.Counter()
        for name in spool.glob(SPOOL_FILES):
            try:
                request = json.loads(spool_text(name))
            except (ValueError, OSError, EOFError, zlib.error):
                continue
            for resource_spans in request.get("resourceSpans", []):
                for scope_spans in resource_spans.get("scopeSpans", []):
                    counts.update(span["spanId"] for span in scope_spans.get("spans", []))
        twice = [span_id for span_id, count in counts.items() if count > 1]
        if twice:
            found[str(spool)] = twice
    return found


def the_session(spans: list[dict[str, Any]]) -> dict[str, Any]:
    sessions = named(spans, "cirron.session")
    assert len(sessions) == 1, f"{len(sessions)} cirron.session spans"
    return sessions[0]


def epoch_batches(spans: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Batch spans by epoch index, each list ordered by batch index."""
    result = {}
    for epoch in named(spans, "epoch"):
        batches = children(spans, epoch, "batch")
        result[attribute(epoch, "index")] = sorted(batches, key=lambda s: attribute(s, "index"))
    return result


# A tiny torch loop (2 epochs of 4 steps, a DataLoader, SGD) that prints TRAINED: the body of
# the scripts the zero-code tests run, as `opentelemetry-instrument python -c` would.
TINY_TORCH_LOOP = """
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    print("TRAINED", flush=True)
"""


# A tiny BERT trained by the HF Trainer for 2 epochs of 2 steps, no download: the body of the
# scripts that run it in a subprocess (they add their own first lines: profiling, imports).
HF_TINY_TRAINER = """
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
torch.set_num_threads(1)
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(
    vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=16, num_labels=2))
data = [{"input_ids": torch.randint(0, 50, (8,)), "labels": torch.tensor(i % 2)} for i in range(8)]
args = TrainingArguments(output_dir="out", num_train_epochs=2, per_device_train_batch_size=4,
                         report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                         logging_strategy="epoch")
Trainer(model=model, args=args, train_dataset=data).train()
print("TRAINED")
"""


def prefetching(loader: Any) -> Any:
    """Batches of ``loader`` as a prefetching wrapper hands them out: each fetched one ahead
    (accelerate's prepared loader, the image-model scripts' prefetchers)."""
    iterator = iter(loader)
    current = next(iterator)
    for upcoming in iterator:
        yield current
        current = upcoming
    yield current


class Tmux:
    """A tmux server of its own, a window ``width`` x ``height`` split into panes, each
    running an interactive bash; what a pane shows is read as a user sees it
    (``capture-pane``). Killed on exit with every process it runs."""

    def __init__(self, cwd: Path, width: int = 200, height: int = 60) -> None:
        import tempfile

        # A socket path must be short (108 bytes): not under pytest's long tmp path.
        self.folder = Path(tempfile.mkdtemp(prefix="cirron-tmux-"))
        self.socket = str(self.folder / "socket")
        self.environment = clean_environment(TERM="xterm-256color")
        self.cwd = cwd
        self.tmux("new-session", "-d", "-x", str(width), "-y", str(height), "-c", str(cwd),
                  "bash --norc --noprofile")  # fmt: skip
        self.panes = [self.tmux("display-message", "-p", "#{pane_id}").strip()]

    def tmux(self, *arguments: str) -> str:
        return subprocess.run(
            ["tmux", "-S", self.socket, "-f", "/dev/null", *arguments],
            env=self.environment, capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip

    def split(self) -> str:
        """A new pane below the last one; its id."""
        pane = self.tmux("split-window", "-v", "-t", self.panes[-1], "-c", str(self.cwd), "-P",
                         "-F", "#{pane_id}", "bash --norc --noprofile")  # fmt: skip
        self.panes.append(pane.strip())
        return self.panes[-1]

    def type(self, pane: str, command: str) -> None:
        """``command`` typed into ``pane``, then Enter."""
        self.tmux("send-keys", "-t", pane, "-l", command)
        self.tmux("send-keys", "-t", pane, "Enter")

    def keys(self, pane: str, *keys: str) -> None:
        self.tmux("send-keys", "-t", pane, *keys)

    def screen(self, pane: str) -> str:
        """What ``pane`` shows now (wrapped lines joined)."""
        return self.tmux("capture-pane", "-p", "-J", "-t", pane)

    def wait_for(self, pane: str, found: Any, timeout: float = 60.0) -> str:
        """The screen of ``pane`` once ``found`` (a text, or a function of the screen) is
        on it; fails with the screen after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen(pane)
            if (found in screen) if isinstance(found, str) else found(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"not on the pane within {timeout}s: {found!r}\n{screen}")
            time.sleep(0.2)

    def __enter__(self) -> Tmux:
        return self

    def __exit__(self, *exc: Any) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True,
                       env=self.environment, timeout=30)  # fmt: skip
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)
