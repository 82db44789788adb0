"""A real OTLP receiver for end-to-end tests: the ``rotel`` collector.

:class:`OtlpReceiver` starts ``rotel-agent`` (shipped inside the ``rotel``
wheel, pinned to 0.0.1a15) in the foreground as a subprocess, on free
127.0.0.1 ports for OTLP/gRPC and OTLP/HTTP, with the blackhole exporter and
the "detailed" debug log of traces on its stdout, which goes to a file in its
own temporary directory (with its own pid and log files). It prints every span
it receives; :func:`parse_spans` turns that text back into span dicts::

    with OtlpReceiver() as receiver:
        ...  # send spans to receiver.http_endpoint or receiver.grpc_endpoint
        spans = receiver.wait_for_spans(lambda spans: len(spans) >= 3)

The debug text is not a stable API of rotel (one more reason to pin it); the
parser understands the format of the pinned version::

    ResourceSpans #0
    Resource attributes:
         -> service.name: Str(train)
    ScopeSpans #0
    InstrumentationScope cirron 0.1.0
    Span #0
        Trace ID       : 8497773290d39fce7143d071e810d025
        Parent ID      : ba65d3d6167ae7fc
        ID             : 433b25a16ec6e4ea
        Name           : batch
        Kind           : SPAN_KIND_INTERNAL
    Start time: 1795280524515541989
    End time: 1795280524515666116
        Status code    : STATUS_CODE_UNSET
        Status message :
    Attributes:
         -> index: Int(0)
    Events:
    SpanEvent #0
         -> Name: loss
         -> Timestamp: 1795280524515627880
         -> DroppedAttributesCount: 0
         -> Attributes::
              -> value: Double(NaN)
    Links:
    SpanLink #0
         -> Trace ID: 0123456789abcdef0123456789abcdef
         -> ID: 2222222222222222
         -> TraceState:
         -> DroppedAttributesCount: 0
         -> Attributes::
              -> l: Bool(true)

A string value may run over several lines (an exception's stack trace); the
lines that follow it, up to the next line of the format, belong to it.

``OtlpReceiver(debug_log=("traces", "metrics"))`` also prints every metric it receives,
exemplars included, and :func:`parse_metrics` reads them back (``receiver.metrics()``)::

    ResourceMetrics #0
    Resource attributes:
         -> service.name: Str(train)
    ScopeMetrics #0
    InstrumentationScope cirron 0.1.0
    Metric #0
    Descriptor:
         -> Name: loss
         -> Unit:
         -> DataType: Histogram
    HistogramDataPoints #0
    Data point attributes:
         -> phase: Str(train)
    StartTimestamp: 1795679534073340950
    Timestamp: 1795679534073699866
    Count: 1
    Sum: 0.5
    Exemplars:
    Exemplar #0
         -> Trace ID: 1234567890abcdef1234567890abcdef
         -> Span ID: 1122334455667788
         -> Timestamp: 1795679534073167998
         -> Value: 0.5
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = [
    "OtlpReceiver",
    "free_port",
    "parse_metrics",
    "parse_spans",
    "parse_value",
    "rotel_binary",
]


def rotel_binary() -> str:
    import rotel

    return os.path.join(os.path.dirname(rotel.__file__), "rotel-agent")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it if the test process dies without stop()."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; stop() is the normal path
        pass


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class OtlpReceiver:
    """A ``rotel-agent`` subprocess printing every received span; see the module docstring."""

    def __init__(
        self,
        directory: str | None = None,
        start_timeout: float = 10.0,
        verbosity: str = "detailed",
        forward_to: str | None = None,
        debug_log: tuple[str, ...] = ("traces",),
    ) -> None:
        # "basic" prints a line per batch instead of every span (long runs); the
        # span parser needs "detailed".
        self.verbosity = verbosity
        # The gRPC endpoint of a next hop (another collector): rotel exports there
        # instead of dropping what it received (a collector per node, then a gateway).
        self.forward_to = forward_to
        self.debug_log = debug_log  # what rotel prints: traces, metrics, logs
        self._own_directory = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="rotel-")
        os.makedirs(self.directory, exist_ok=True)
        self.stdout_path = os.path.join(self.directory, "rotel.stdout")
        self.stderr_path = os.path.join(self.directory, "rotel.stderr")
        self.pid_file = os.path.join(self.directory, "rotel.pid")
        self.log_file = os.path.join(self.directory, "rotel.log")
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.grpc_port = 0
        self.http_port = 0

    # -- addresses --------------------------------------------------------------
    @property
    def grpc_endpoint(self) -> str:
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``."""
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT`` with ``http/protobuf`` (``/v1/traces`` is appended)."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def traces_url(self) -> str:
        return f"{self.http_endpoint}/v1/traces"

    # -- life cycle -------------------------------------------------------------
    def start(self, attempts: int = 3, ports: tuple[int, int] | None = None) -> OtlpReceiver:
        """Start rotel and wait (bounded) until both ports accept connections.

        ``ports``: (gRPC, HTTP) to listen on, e.g. those of a backend that was
        down; by default two free ones.
        """
        error = "not started"
        for _ in range(attempts):  # a free port can be taken between probe and bind
            self._stop_process()
            self.grpc_port, self.http_port = ports or (free_port(), free_port())
            if self.grpc_port == self.http_port:
                continue
            self._spawn()
            error = self._wait_listening()
            if not error:
                return self
        self.stop()
        raise RuntimeError(f"rotel did not start: {error}")

    def _spawn(self) -> None:
        command = [
            rotel_binary(), "start",
            "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
            "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}",
            *(
                ["--exporter", "otlp", "--otlp-exporter-endpoint", self.forward_to,
                 "--otlp-exporter-protocol", "grpc"]
                if self.forward_to else ["--exporter", "blackhole"]
            ),
            *(option for kind in self.debug_log for option in ("--debug-log", kind)),
            "--debug-log-verbosity", self.verbosity,
            "--pid-file", self.pid_file,
            "--log-file", self.log_file,
        ]  # fmt: skip
        # ROTEL_* variables would configure the agent behind our back.
        environment = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
        environment["NO_COLOR"] = "1"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self.directory,
                env=environment,
                start_new_session=True,  # Ctrl-C in a terminal reaches pytest, not rotel
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def _wait_listening(self) -> str:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return f"exited with {self.process.returncode}: {self.output_tail()}"
            if _listening(self.grpc_port) and _listening(self.http_port):
                return ""
            time.sleep(0.02)
        return f"not listening after {self.start_timeout}s: {self.output_tail()}"

    def _stop_process(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
            except ProcessLookupError:
                pass
        # Belt and braces: SIGTERM handled but exit hung is covered above; a
        # process that ignored everything is reaped here.
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; always reaps the process. Idempotent."""
        try:
            self._stop_process()
        finally:
            if self._own_directory and os.environ.get("KEEP_ROTEL_OUTPUT") != "1":
                shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what it received ---------------------------------------------------------
    def text(self) -> str:
        """Everything rotel printed on stdout so far, ANSI colours removed."""
        try:
            with open(self.stdout_path, encoding="utf-8", errors="replace") as stream:
                data = stream.read()
        except FileNotFoundError:
            return ""
        return _ANSI.sub("", data)

    def log(self) -> str:
        """Everything rotel printed, stdout then stderr (its own log lines included)."""
        text = self.text()
        try:
            with open(self.stderr_path, encoding="utf-8", errors="replace") as stream:
                text += "\n[stderr]\n" + _ANSI.sub("", stream.read())
        except FileNotFoundError:
            pass
        return text

    def errors(self) -> list[str]:
        """rotel's own ERROR log lines (a request it could not decode, ...)."""
        return [line for line in self.log().splitlines() if _ERROR_LINE.match(line)]

    def output_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def spans(self) -> list[dict[str, Any]]:
        return parse_spans(self.text())

    def metrics(self) -> list[dict[str, Any]]:
        """The metric data points received (with ``debug_log`` holding ``metrics``)."""
        return parse_metrics(self.text())

    def span_id_counts(self) -> collections.Counter[str]:
        """How many times each span id arrived (cheap on hundreds of thousands of spans)."""
        return collections.Counter(_SPAN_ID.findall(self.text()))

    def wait_for(
        self, predicate: Callable[[str], bool], timeout: float = 10.0, interval: float = 0.05
    ) -> str:
        """Poll the debug text until ``predicate(text)`` holds and the text has stopped
        growing for one poll (rotel writes line by line); returns the text.

        Raises ``TimeoutError`` with the end of rotel's output after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        previous: str | None = None
        while True:
            text = self.text()
            if text == previous and predicate(text):
                return text
            if time.monotonic() >= deadline:
                if predicate(text):
                    return text
                raise TimeoutError(
                    f"rotel did not receive the expected spans within {timeout}s; "
                    f"its output ends with:\n{self.output_tail()}"
                )
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"rotel exited ({self.process.returncode}): {self.output_tail()}"
                )
            previous = text
            time.sleep(interval)

    def wait_for_spans(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        """Like :meth:`wait_for`, with ``predicate`` on the parsed spans; returns them."""
        text = self.wait_for(lambda text: predicate(parse_spans(text)), timeout)
        return parse_spans(text)

    def post_json(
        self, body: bytes | str | dict[str, Any], timeout: float = 5.0
    ) -> tuple[int, bytes]:
        """POST an OTLP/JSON request to ``/v1/traces``; returns (status, response body)."""
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8")
        request = urllib.request.Request(
            self.traces_url, data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()


# -- parsing the debug text --------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SPAN_ID = re.compile(r"^\s+ID\s+: ([0-9a-f]{16})\s*$", re.MULTILINE)
_LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?\s+(TRACE|DEBUG|INFO|WARN|ERROR)\b"
)
_ERROR_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S*\s+ERROR\b")
_HEADER = re.compile(r"^(ResourceSpans|ScopeSpans|Span|SpanEvent|SpanLink) #(\d+)\s*$")
_SPAN_FIELD = re.compile(
    r"^\s+(Trace ID|Parent ID|ID|Name|Kind|Status code|Status message)\s*: ?(.*)$"
)
_ARROW = re.compile(r"^(\s*)-> (.*)$")
_KEY_VALUE = re.compile(r"^(.*?): ([A-Z][A-Za-z]*\(.*)$", re.DOTALL)
_OTHER = re.compile(
    r"^(Resource SchemaURL:|Resource attributes:|ScopeSpans SchemaURL:|InstrumentationScope\b"
    r"|Start time:|End time:|Attributes:|Events:|Links:)"
)
_TYPE = re.compile(r"([A-Z][A-Za-z]*)\(")
_NESTED_END = re.compile(r"\)(?=\)|, [A-Z][A-Za-z]*\(|,[A-Z][A-Za-z]*\(|$)")


def _structural(line: str) -> bool:
    return bool(
        _HEADER.match(line) or _SPAN_FIELD.match(line) or _ARROW.match(line)
        or _OTHER.match(line) or _LOG_LINE.match(line)
    )  # fmt: skip


def parse_value(text: str) -> Any:
    """A rotel ``AnyValue`` as Python: ``Str(a)`` -> ``'a'``, ``Int(3)`` -> 3,
    ``Double(NaN)`` -> nan, ``Bool(true)`` -> True, ``Slice(...)`` -> list,
    ``Map(k:v, ...)`` -> dict, ``Bytes([0, 1])`` -> bytes."""
    value, end = _parse(text, 0, top=True)
    if end != len(text):
        raise ValueError(f"trailing text after a value: {text!r}")
    return value


def _parse(text: str, position: int, top: bool) -> tuple[Any, int]:
    match = _TYPE.match(text, position)
    if not match:
        raise ValueError(f"not a rotel value at {position}: {text!r}")
    kind, start = match.group(1), match.end()
    if kind == "Str":
        if top:  # the whole rest of the text, whatever parentheses it holds
            if not text.endswith(")"):
                raise ValueError(f"unterminated Str: {text!r}")
            return text[start:-1], len(text)
        end = _NESTED_END.search(text, start)
        if end is None:
            raise ValueError(f"unterminated Str: {text!r}")
        return text[start : end.start()], end.end()
    if kind in ("Slice", "Map"):
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        position = start
        while not text.startswith(")", position):
            if items or pairs:
                if text.startswith(", ", position):
                    position += 2
                elif text.startswith(",", position):
                    position += 1
                else:
                    raise ValueError(f"expected ',' at {position}: {text!r}")
            if kind == "Map":
                colon = text.index(":", position)
                key = text[position:colon]
                pairs[key], position = _parse(text, colon + 1, top=False)
            else:
                item, position = _parse(text, position, top=False)
                items.append(item)
            if position >= len(text):
                raise ValueError(f"unterminated {kind}: {text!r}")
        return (pairs if kind == "Map" else items), position + 1
    end = text.index(")", start)
    body = text[start:end]
    if kind == "Int":
        return int(body), end + 1
    if kind == "Double":
        return float(body), end + 1  # float() reads NaN, inf and -inf as Rust prints them
    if kind == "Bool":
        return body == "true", end + 1
    if kind == "Bytes":
        inner = body.strip().strip("[]").strip()
        return (bytes(int(b) for b in inner.split(",")) if inner else b""), end + 1
    if kind == "Empty":
        return None, end + 1
    raise ValueError(f"unknown rotel value type {kind!r}: {text!r}")


def _new_span(resource: dict[str, Any], scope: dict[str, Any]) -> dict[str, Any]:
    return {
        "trace_id": None,
        "parent_id": None,
        "span_id": None,
        "name": None,
        "kind": None,
        "start_ns": None,
        "end_ns": None,
        "status_code": None,
        "status_message": None,
        "attributes": {},
        "events": [],
        "links": [],
        "resource": dict(resource),
        "scope": dict(scope),
    }


def parse_spans(text: str) -> list[dict[str, Any]]:
    """Every span in rotel's detailed debug text, in the order printed.

    Each span: ``trace_id``, ``parent_id`` (None for a root), ``span_id`` (hex),
    ``name``, ``kind``, ``start_ns``, ``end_ns``, ``status_code`` /
    ``status_message`` (None when rotel printed none), ``attributes`` (Python
    values), ``events`` (``name``, ``time_ns``, ``attributes``), ``links``
    (``trace_id``, ``span_id``, ``attributes``), ``resource`` (attributes) and
    ``scope`` (``name``, ``version``).
    """
    spans: list[dict[str, Any]] = []
    resource: dict[str, Any] = {}
    scope: dict[str, Any] = {}
    span: dict[str, Any] | None = None
    item: dict[str, Any] | None = None  # the open event or link
    section = ""  # resource | span | attributes | event | event-attributes | link | link-attributes
    pending: list[Any] | None = None  # [target dict, key, raw text, is_value]

    def finish_pending() -> None:
        nonlocal pending
        if pending is None:
            return
        target, key, raw, is_value = pending
        pending = None
        if is_value:
            try:
                target[key] = parse_value(raw)
            except ValueError:
                target[key] = raw  # keep what we can't read; assertions will show it
        else:
            target[key] = raw

    in_metrics = False  # a ResourceMetrics block (debug_log with metrics): none of the spans'
    for line in text.splitlines():
        if line.startswith(("ResourceMetrics #", "ResourceSpans #")):
            in_metrics = line.startswith("ResourceMetrics")
        if in_metrics:
            continue
        if pending is not None and not _structural(line):
            pending[2] += "\n" + line  # a string value over several lines
            continue
        finish_pending()
        if not line.strip() or _LOG_LINE.match(line):
            continue
        header = _HEADER.match(line)
        if header:
            kind = header.group(1)
            if kind == "ResourceSpans":
                resource, scope, span, item, section = {}, {}, None, None, ""
            elif kind == "ScopeSpans":
                scope, span, item, section = {}, None, None, ""
            elif kind == "Span":
                span = _new_span(resource, scope)
                spans.append(span)
                item, section = None, "span"
            elif kind == "SpanEvent" and span is not None:
                item = {"name": None, "time_ns": None, "attributes": {}}
                span["events"].append(item)
                section = "event"
            elif kind == "SpanLink" and span is not None:
                item = {"trace_id": None, "span_id": None, "trace_state": None, "attributes": {}}
                span["links"].append(item)
                section = "link"
            continue
        if line.startswith("Resource attributes:"):
            section = "resource"
            continue
        if line.startswith("InstrumentationScope"):
            parts = line.split(None, 2)[1:]
            scope["name"] = parts[0] if parts else ""
            scope["version"] = parts[1].strip() if len(parts) > 1 else ""
            continue
        if line.startswith(("Start time:", "End time:")) and span is not None:
            value = line.split(":", 1)[1].strip()
            span["start_ns" if line.startswith("Start") else "end_ns"] = (
                int(value) if value.isdigit() else value
            )
            continue
        if line.startswith("Attributes:"):
            section = "attributes"
            continue
        if line.startswith(("Events:", "Links:")):
            continue
        field = _SPAN_FIELD.match(line)
        if field and span is not None and section == "span":
            name, value = field.group(1), field.group(2)
            key = {
                "Trace ID": "trace_id",
                "Parent ID": "parent_id",
                "ID": "span_id",
                "Name": "name",
                "Kind": "kind",
                "Status code": "status_code",
                "Status message": "status_message",
            }[name]
            if key == "status_message":
                pending = [span, key, value, False]  # may run over several lines
            else:
                span[key] = value.strip() or None
            continue
        arrow = _ARROW.match(line)
        if not arrow:
            continue  # Resource/ScopeSpans SchemaURL and anything this version adds
        body = arrow.group(2)
        if section in ("event", "link") and item is not None:
            if body.rstrip() == "Attributes::":
                section += "-attributes"
                continue
            name, _, value = body.partition(": ")
            value = value.strip() if _ else body.partition(":")[2].strip()
            if section == "event":
                if name == "Name":
                    item["name"] = value
                elif name == "Timestamp":
                    item["time_ns"] = int(value) if value.isdigit() else value
            else:
                if name == "Trace ID":
                    item["trace_id"] = value or None
                elif name == "ID":
                    item["span_id"] = value or None
                elif name == "TraceState":
                    item["trace_state"] = value
            continue
        key_value = _KEY_VALUE.match(body)
        if not key_value:
            continue
        key, raw = key_value.group(1), key_value.group(2)
        if section == "resource":
            target = resource
        elif section == "attributes" and span is not None:
            target = span["attributes"]
        elif section in ("event-attributes", "link-attributes") and item is not None:
            target = item["attributes"]
        else:
            continue
        pending = [target, key, raw, True]
    finish_pending()
    return spans


_METRIC_HEADER = re.compile(
    r"^(ResourceMetrics|ScopeMetrics|Metric|NumberDataPoints|HistogramDataPoints"
    r"|ExponentialHistogramDataPoints|SummaryDataPoints|Exemplar|ResourceSpans) #(\d+)\s*$"
)
_POINT_FIELD = re.compile(r"^(StartTimestamp|Timestamp|Count|Sum|Min|Max|Value): (.*)$")


def _number(text: str) -> Any:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def parse_metrics(text: str) -> list[dict[str, Any]]:
    """Every metric data point in rotel's debug text (``--debug-log metrics``), in order.

    Each point: ``name``, ``unit``, ``type`` (``Histogram``, ``Sum``, ``Gauge``, ...),
    ``attributes``, ``start_ns``, ``time_ns``, ``value`` (sums and gauges), ``count``,
    ``sum``, ``min``, ``max`` (histograms), ``exemplars`` (``trace_id``, ``span_id``,
    ``time_ns``, ``value``), ``resource`` (attributes) and ``scope`` (``name``).
    """
    points: list[dict[str, Any]] = []
    resource: dict[str, Any] = {}
    scope: dict[str, Any] = {}
    metric: dict[str, Any] = {}
    point: dict[str, Any] | None = None
    exemplar: dict[str, Any] | None = None
    section = ""  # resource | descriptor | point-attributes | exemplar | spans (not ours)
    for line in text.splitlines():
        header = _METRIC_HEADER.match(line)
        if header:
            kind = header.group(1)
            if kind == "ResourceSpans":
                section = "spans"
            elif kind == "ResourceMetrics":
                resource, section = {}, ""
            elif kind == "ScopeMetrics":
                scope, section = {}, ""
            elif kind == "Metric":
                metric, point, section = {"name": None, "unit": "", "type": None}, None, ""
            elif kind == "Exemplar" and point is not None:
                exemplar = {"trace_id": None, "span_id": None, "time_ns": None, "value": None}
                point["exemplars"].append(exemplar)
                section = "exemplar"
            elif kind.endswith("DataPoints"):
                point = {
                    **{k: metric.get(k) for k in ("name", "unit", "type")},
                    "attributes": {}, "exemplars": [], "resource": dict(resource),
                    "scope": dict(scope),
                }  # fmt: skip
                points.append(point)
                section = ""
            continue
        if section == "spans" or _LOG_LINE.match(line):
            continue
        if line.startswith("Resource attributes:"):
            section = "resource"
        elif line.startswith("InstrumentationScope"):
            parts = line.split(None, 2)[1:]
            scope["name"] = parts[0] if parts else ""
        elif line.startswith("Descriptor:"):
            section = "descriptor"
        elif line.startswith("Data point attributes:"):
            section = "point-attributes"
        elif line.startswith("Exemplars:"):
            section = "exemplar"
        elif (field := _POINT_FIELD.match(line)) and point is not None:
            name, value = field.group(1), field.group(2)
            key = {"StartTimestamp": "start_ns", "Timestamp": "time_ns"}.get(name, name.lower())
            point[key] = _number(value)
        elif arrow := _ARROW.match(line):
            body = arrow.group(2)
            key, _, value = body.partition(": ")
            key, value = (key.rstrip(":"), value.strip()) if _ else (body.rstrip(":"), "")
            if section == "descriptor":
                field_name = {"Name": "name", "Unit": "unit", "DataType": "type"}.get(key)
                if field_name:
                    metric[field_name] = value
            elif section == "exemplar" and exemplar is not None:
                if key == "Trace ID":
                    exemplar["trace_id"] = value or None
                elif key == "Span ID":
                    exemplar["span_id"] = value or None
                elif key == "Timestamp":
                    exemplar["time_ns"] = _number(value)
                elif key == "Value":
                    exemplar["value"] = _number(value)
            elif section in ("resource", "point-attributes") and (pair := _KEY_VALUE.match(body)):
                target = resource if section == "resource" else (point or {})["attributes"]
                try:
                    target[pair.group(1)] = parse_value(pair.group(2))
                except ValueError:
                    target[pair.group(1)] = pair.group(2)
    return points
