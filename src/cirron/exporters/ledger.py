"""What each OTLP endpoint acknowledged, kept beside the spool, so a replay sends exactly the rest.

With the spool on (the default) every span is on disk, whatever the network
did. Each batch an endpoint acknowledges, from the live ``otlp`` sink or from
``cirron export``, is appended to ``<path>/delivered/<key>/<pid>.ids``: 24 bytes
a span (the 16-byte trace id and the 8-byte span id, big-endian, as OTLP
carries them), one ``write`` per batch. ``<key>`` names the endpoint: 16 hex
digits of a hash of its normalised URL (:func:`normalise`), which is written
beside, in ``<key>/endpoint``. A replay to an endpoint sends the spool's spans
that none of its files lists.

Cheap: one short append per acknowledged batch, on the sink's own thread.
Durable against a killed process: a write that returned is in the kernel's
hands, so only a batch acknowledged in the moment of a crash can go unrecorded,
and be sent a second time (at most one batch). A record cut short by a crash
is ignored. Each writer appends to the file of its own pid, so processes never
interleave.

The same endpoint written two ways (``localhost`` and ``127.0.0.1``, or a
collector's gRPC and HTTP ports) is two endpoints here: nothing can tell they
are one backend.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from . import files

DIRECTORY = "delivered"
RECORD = 24  # bytes a span: trace id (16), span id (8)
_TRACES_PATH = "/v1/traces"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise(endpoint: str) -> str:
    """The one spelling of ``endpoint`` the ledger keys on.

    ``http://Host:4318``, ``http://host:4318/`` and ``http://host:4318/v1/traces``
    are the same endpoint (the OTLP/HTTP exporter appends the traces path to a
    base URL); a gRPC target without a scheme (``host:4317``) is ``http://host:4317``.
    """
    text = endpoint.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is not a number: keep the text as it is
        port = None
    path = parts.path.rstrip("/")
    if path.endswith(_TRACES_PATH):
        path = path[: -len(_TRACES_PATH)]
    return f"{scheme}://{host}" + (f":{port}" if port else "") + path


def key(endpoint: str) -> str:
    return hashlib.sha256(normalise(endpoint).encode()).hexdigest()[:16]


def span_key(span: Any) -> bytes:
    """A span's 24-byte record: its trace id and span id."""
    context = span.context
    return context.trace_id.to_bytes(16, "big") + context.span_id.to_bytes(8, "big")


class Ledger:
    """The acknowledgements of one endpoint under one cirron directory."""

    def __init__(self, path: str, endpoint: str) -> None:
        self.endpoint = normalise(endpoint)
        self.directory = os.path.join(path, DIRECTORY, key(endpoint))
        self._named = False

    @property
    def file(self) -> str:
        # The pid at the time of writing: a forked child that exports has a file of its own.
        return os.path.join(self.directory, f"{os.getpid()}.ids")

    def prepare(self) -> None:
        """Make sure acknowledgements can be noted here, before anything is sent (OSError if
        not: a replay that sends without noting would send it all again next time)."""
        self._name_directory()
        os.close(os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, files.FILE_MODE))

    def record(self, spans: Iterable[Any]) -> None:
        """Note ``spans`` as acknowledged by the endpoint (one append)."""
        data = b"".join(span_key(span) for span in spans)
        if not data:
            return
        self._name_directory()
        handle = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, files.FILE_MODE)
        try:
            os.write(handle, data)
        finally:
            os.close(handle)

    def acknowledged(self) -> set[bytes]:
        """The records of every span the endpoint acknowledged, from every writer."""
        found: set[bytes] = set()
        for name in glob.glob(os.path.join(glob.escape(self.directory), "*.ids")):
            try:
                with open(name, "rb") as stream:
                    data = stream.read()
            except OSError:
                continue  # unreadable: its spans are sent again, never lost
            whole = len(data) - len(data) % RECORD  # a record cut short by a crash
            found.update(data[start : start + RECORD] for start in range(0, whole, RECORD))
        return found

    def _name_directory(self) -> None:
        if self._named:
            return
        files.make_directory(self.directory)
        label = os.path.join(self.directory, "endpoint")
        if not os.path.exists(label):
            files.write_whole(label, (self.endpoint + "\n").encode())
        self._named = True
