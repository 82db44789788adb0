"""``cirron export --endpoint``: send a spool's spans to an OTLP backend, each span once.

What the endpoint has acknowledged, from the live ``otlp`` sink or from an
earlier export, is in its ledger beside the spool
(:mod:`cirron.exporters.ledger`): a replay sends the rest, in batches of
:data:`BATCH` spans, and notes each batch the endpoint acknowledges as it
goes, so a replay that was interrupted (killed, a network failure) resumes at
the first batch not acknowledged.

Each batch is one request, made once, with a bounded timeout: a dead endpoint
ends the replay at the first batch (within the timeout, 10 s by default), in
one line, rather than retrying for minutes; a batch the endpoint rejects
(HTTP 4xx, a gRPC invalid argument) is counted and skipped, the rest still go.
The requests run with OpenTelemetry's instrumentation suppressed, so an
instrumented HTTP library never traces cirron's own exports.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..exporters.ledger import Ledger, span_key
from ..otel.spans import untraced

BATCH = 512  # spans per request
DEFAULT_TIMEOUT = 10.0  # seconds a request may take
MAX_TIMEOUT = 3600.0  # more is a mistake (and infinity overflows the socket's clock)
PROTOCOLS = ("http/protobuf", "grpc")


class EndpointError(Exception):
    """The endpoint can't take the replay now (unreachable, down, refusing): stop."""


class Rejected(Exception):
    """The endpoint refused this one batch (its content): skip it, send the others."""


@dataclass
class Outcome:
    sent: int = 0  # spans acknowledged by this replay
    already: int = 0  # spans the endpoint had acknowledged before
    rejected: int = 0  # spans of batches the endpoint refused
    rejected_why: str = ""  # what the endpoint said of the first it refused
    unsent: int = 0  # spans not sent: the endpoint could not be reached
    stopped: str = ""  # why the replay stopped early
    retry: str = "when the endpoint is up"  # when running it again will send the rest


Send = Callable[[Sequence[Any]], None]


def check_endpoint(endpoint: str, protocol: str) -> str:
    """The endpoint to send to; a ``ValueError`` naming ``--endpoint`` when it can't be one."""
    text = endpoint.strip()
    if protocol == "grpc":
        text = text if "://" in text else "http://" + text  # host:port is gRPC's own form
        _check_address(text, endpoint)
        return text
    parts = _check_address(text, endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"--endpoint must be an http:// or https:// URL for OTLP/HTTP, such as "
            f"http://127.0.0.1:4318, got {endpoint!r}"
        )
    return (
        text if parts.path.rstrip("/").endswith("/v1/traces") else text.rstrip("/") + "/v1/traces"
    )


def _check_address(text: str, endpoint: str) -> Any:
    """``text`` split, its host and port readable (a ``ValueError`` naming ``--endpoint``)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises for a port out of range or not a number
    except ValueError as error:
        raise ValueError(f"--endpoint {endpoint!r} is not a usable address ({error})") from None
    if parts.scheme in ("http", "https") and parts.netloc and not parts.hostname:
        raise ValueError(f"--endpoint {endpoint!r} names no host")
    return parts


def sender(endpoint: str, protocol: str, headers: dict[str, str], timeout: float) -> Send:
    """A function that sends one batch in one request, or raises :class:`EndpointError` /
    :class:`Rejected`."""
    if protocol == "grpc":
        return _grpc_sender(endpoint, headers, timeout)
    return _http_sender(endpoint, headers, timeout)


def _http_sender(url: str, headers: dict[str, str], timeout: float) -> Send:
    import requests
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    session = requests.Session()
    fields = {"Content-Type": "application/x-protobuf", **headers}

    def send(spans: Sequence[Any]) -> None:
        data = encode_spans(spans).SerializeToString()
        try:
            response = session.post(url, data=data, headers=fields, timeout=timeout)
        except requests.RequestException as error:
            raise EndpointError(_reason(error)) from None
        if response.ok:
            return
        why = f"HTTP {response.status_code} {response.reason}"
        # Only these are about the batch itself; any other answer (a wrong path, no access,
        # the backend busy or down) would be the same for the next batch.
        if response.status_code in (400, 413):
            raise Rejected(why)
        raise EndpointError(why)

    return send


def _grpc_sender(endpoint: str, headers: dict[str, str], timeout: float) -> Send:
    import grpc
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

    parts = urlsplit(endpoint)
    target = parts.netloc
    channel = (
        grpc.secure_channel(target, grpc.ssl_channel_credentials())
        if parts.scheme == "https"
        else grpc.insecure_channel(target)
    )
    stub = TraceServiceStub(channel)
    metadata = tuple((key.lower(), value) for key, value in headers.items())

    def send(spans: Sequence[Any]) -> None:
        try:
            stub.Export(encode_spans(spans), metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            details = error.details() if hasattr(error, "details") else str(error)
            why = f"gRPC {getattr(code, 'name', code)} ({_reason(details) or details})"
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise Rejected(why) from None
            raise EndpointError(why) from None

    return send


def _reason(error: BaseException | str) -> str:
    """The short cause of a connection error (refused, timed out, name unknown), or ''."""
    text = str(error).lower()
    for known in ("connection refused", "timed out", "name or service not known", "no route"):
        if known in text:
            return known
    return "" if isinstance(error, str) else type(error).__name__


def replay(spans: Sequence[Any], ledger: Ledger, send: Send, everything: bool = False) -> Outcome:
    """Send ``spans`` the ledger does not list (all of them with ``everything``), noting each
    acknowledged batch in it."""
    outcome = Outcome()
    acknowledged = set() if everything else ledger.acknowledged()
    todo = [span for span in spans if span_key(span) not in acknowledged]
    outcome.already = len(spans) - len(todo)
    with progress(len(todo)) as bar, untraced():
        for start in range(0, len(todo), BATCH):
            batch = todo[start : start + BATCH]
            try:
                send(batch)
            except Rejected as error:
                outcome.rejected += len(batch)
                outcome.rejected_why = outcome.rejected_why or str(error)
            except EndpointError as error:
                outcome.unsent = len(todo) - start
                outcome.stopped = str(error)
                break
            else:
                outcome.sent += len(batch)
                try:
                    ledger.record(batch)
                except OSError as error:  # the disk filled: sending on would send twice later
                    outcome.unsent = len(todo) - start - len(batch)
                    outcome.stopped = (
                        f"what was sent could not be noted in {ledger.directory} "
                        f"({error.strerror or error}; its last {len(batch)} may arrive twice)"
                    )
                    outcome.retry = "once that folder can be written"
                    break
            bar.update(len(batch))
    return outcome


def progress(total: int, unit: str = " spans", minimum: int = 1) -> Any:
    """A progress bar on a terminal (how many of ``total``, the rate, the time left) for work
    of ``minimum`` or more; silent when stderr is a file or a pipe."""
    from tqdm import tqdm

    size = shutil.get_terminal_size()
    return tqdm(
        total=total,
        unit=unit,
        file=sys.stderr,
        disable=None if total >= minimum else True,  # None: only on a terminal
        leave=False,
        # The terminal's size as the shell says it ($COLUMNS, $LINES), or 80x24: one that
        # reports none (a fresh pseudo-terminal) would get no bar from tqdm at all.
        ncols=size.columns,
        nrows=size.lines,
    )
