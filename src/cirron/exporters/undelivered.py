"""The list of spans a network sink lost, kept beside the spool so a replay sends exactly those.

With the spool on (the default) every span is on disk, whatever the network
did. When the ``otlp`` sink loses spans (its queue full in a burst, a failed
export, the process ending first), their ids are appended to
``<path>/undelivered/otlp-<pid>.txt``, one span per line: the trace id (32 hex
digits), a space, the span id (16 hex digits), the same ids the spool's
OTLP/JSON files hold. A replay from the spool sends the spans listed here and
nothing the backend already has. An export that failed on a timeout may
still have reached the backend: replaying it then sends it twice, which OTLP
backends store as the same span id again (at least once, never lost).

A line is written in one ``write`` call; a line cut short by a crash is
ignored by :func:`undelivered_spans`.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import Any

from . import files

DIRECTORY = "undelivered"
_LINE = re.compile(r"^([0-9a-f]{32}) ([0-9a-f]{16})$")


class UndeliveredJournal:
    """Appends the ids of spans ``sink`` lost to its file under ``<path>/undelivered/``."""

    def __init__(self, path: str, sink: str) -> None:
        self.directory = os.path.join(path, DIRECTORY)
        self.sink = sink

    @property
    def file(self) -> str:
        # The pid at the time of writing: a forked child that profiles has its own file.
        return os.path.join(self.directory, f"{self.sink}-{os.getpid()}.txt")

    def __call__(self, spans: Sequence[Any]) -> None:
        if not spans:
            return
        lines = [f"{span.context.trace_id:032x} {span.context.span_id:016x}\n" for span in spans]
        files.make_directory(self.directory)
        handle = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, files.FILE_MODE)
        try:
            os.write(handle, "".join(lines).encode("ascii"))
        finally:
            os.close(handle)


def undelivered_spans(path: str = ".cirron", sink: str = "otlp") -> set[tuple[str, str]]:
    """(trace id, span id) in hex of every span ``sink`` lost, from every process under ``path``."""
    found: set[tuple[str, str]] = set()
    for name in glob.glob(os.path.join(path, DIRECTORY, f"{glob.escape(sink)}-*.txt")):
        with open(name, encoding="ascii", errors="replace") as stream:
            for line in stream:
                match = _LINE.match(line.rstrip("\n"))
                if match:
                    found.add((match.group(1), match.group(2)))
    return found
