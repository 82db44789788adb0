"""Reading the spool back: the one reader of spool files, whatever they hold.

``ci.read_spool``, ``ci.spool_spans`` and every ``cirron`` command read through it.

- **Where.** ``path`` is a cirron directory (``.cirron``: its ``spool/`` holds the files),
  the spool folder itself, or one file. In a folder, the spool files are those named
  ``<pid>-<sequence>.json`` (digits), oldest first per process; any other file (notes, a
  file still being written under its temporary name) is passed over without a word. A
  file named on its own is read whatever its name.
- **A file** must be UTF-8 JSON holding an object with a ``resourceSpans`` list (an
  OTLP/JSON ``ExportTraceServiceRequest``). One that is not (unreadable, not UTF-8, not
  JSON, nested too deeply to parse, another JSON value) is skipped whole.
- **A span** is read as :mod:`cirron.exporters.otlp_json_decoder` says: one whose ids,
  name, times, kind, flags or status are wrong is skipped, and the other spans of its file
  are kept; an attribute, event or link that is wrong (a value not of its type, or nested
  more than 32 levels) is dropped, and its span kept.
- **Text.** A lone surrogate (``"\\ud800"`` in the JSON text), which no UTF-8 writer or
  OTLP exporter takes, is replaced by U+FFFD in what the commands show and send; nothing is
  skipped for it. ``ci.read_spool`` and ``ci.spool_spans`` give the text as written.

Nothing is raised for what a file holds, and nothing is logged: each file with a problem
gives one :class:`Problem` (the file, the first problem and how many more), and the caller
says it (the ``cirron`` command on stderr, ``ci.spool_spans`` on the ``cirron`` logger).
Nothing recurses on the input's depth: JSON nested too deeply for ``json.loads`` is a bad
file, and attribute values are read to 32 levels only.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from .otlp_json_decoder import RequestDecoder

SPOOL_FOLDER = "spool"
SPOOL_NAME = re.compile(r"([0-9]+)-([0-9]+)\.json")  # <pid>-<sequence>.json, matched whole
# A lone surrogate can only come from a \uXXXX escape in the text: look for one before
# walking a whole document.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_REPAIRED = "lone surrogates in its text replaced by U+FFFD"


@dataclass(frozen=True)
class Problem:
    """What was wrong with one spool file: ``whole`` when it was skipped whole, else some of
    it was skipped, dropped or repaired and the rest read (``reason`` says which)."""

    file: str
    reason: str
    whole: bool = True

    def __str__(self) -> str:
        return (
            f"skipping {self.file}: {self.reason}" if self.whole else f"{self.file}: {self.reason}"
        )


@dataclass
class SpoolFile:
    """One spool file as read: its spans as SDK ``ReadableSpan``s, the OTLP/JSON request
    holding just those spans (``{"resourceSpans": []}`` for a file skipped whole), and what
    was wrong with it, if anything."""

    name: str
    spans: list[ReadableSpan]
    request: dict[str, Any]
    problem: Problem | None


# -- the files ------------------------------------------------------------------------------
def spool_folder(path: str) -> str:
    """The folder holding the spool files: ``<path>/spool`` when there is one, else ``path``."""
    nested = os.path.join(path, SPOOL_FOLDER)
    return nested if os.path.isdir(nested) else path


def cirron_directory(path: str) -> str:
    """The cirron directory of ``path`` (itself, its spool folder, or a file in that folder):
    where what is kept beside the spool goes (an export's ledger)."""
    folder = (os.path.dirname(path) or ".") if os.path.isfile(path) else path
    if os.path.isdir(os.path.join(folder, SPOOL_FOLDER)):
        return folder
    absolute = os.path.abspath(folder)
    return os.path.dirname(absolute) if os.path.basename(absolute) == SPOOL_FOLDER else folder


def spool_files(path: str = ".cirron") -> list[str]:
    """The spool files at ``path`` (a cirron directory, its spool folder or one file),
    oldest first per process; none when ``path`` does not exist."""
    if os.path.isfile(path):
        return [path]
    folder = spool_folder(path)
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                match = SPOOL_NAME.fullmatch(entry.name)
                if match and _file_like(entry):
                    found.append(((int(match[1]), int(match[2])), entry.path))
    except OSError:  # no such folder (or not one)
        return []
    return [name for _order, name in sorted(found)]


def _file_like(entry: os.DirEntry[str]) -> bool:
    """A file, or what cannot even be asked (a symlink loop): then its reading says why."""
    try:
        return entry.is_file()
    except OSError:
        return True


def read_file(name: str, *, repair: bool = True) -> SpoolFile:
    """The spool file ``name``, read; never raises for what it holds.

    ``repair=False`` keeps every string as written, a lone surrogate included, for a caller
    that hands the JSON on as it is (``ci.read_spool``, ``ci.spool_spans``).
    """
    with collector_paused():
        document, reason, repaired = _load(name, repair)
        if reason is not None:
            return SpoolFile(name, [], {"resourceSpans": []}, Problem(name, reason))
        decoder = RequestDecoder()
        try:
            spans, request = decoder.decode(document)
        except Exception as error:  # a reader that breaks on a file must not break the rest
            unreadable = Problem(name, f"unreadable ({error!r})")
            return SpoolFile(name, [], {"resourceSpans": []}, unreadable)
    summary = decoder.summary(len(spans))
    if summary is None:
        problem = Problem(name, _REPAIRED, whole=False) if repaired else None
    else:
        reason, whole = summary
        problem = Problem(name, reason + (f"; {_REPAIRED}" if repaired else ""), whole)
    return SpoolFile(name, spans, request, problem)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while one file is parsed and decoded, then as it was.

    A file is hundreds of thousands of small dicts, lists and spans, none of them in a
    cycle, and the collections they set off, each walking what was read so far, took longer
    than the reading (100,000 spans: 3.8 s, 1.7 s with it paused). Reference counting frees
    as ever; a program that turned the collector off keeps it off.
    """
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def read_files(names: Iterable[str], *, repair: bool = True) -> Iterator[SpoolFile]:
    """Each of ``names`` as read (see :func:`read_file`), one at a time: for a caller that
    streams a large spool."""
    for name in names:
        yield read_file(name, repair=repair)


def read_spans(path: str = ".cirron") -> tuple[list[ReadableSpan], list[Problem]]:
    """Every span of the spool at ``path`` that reads, and a problem per file that did not
    read whole."""
    spans: list[ReadableSpan] = []
    problems: list[Problem] = []
    for read in read_files(spool_files(path)):
        spans += read.spans
        if read.problem is not None:
            problems.append(read.problem)
    return spans, problems


def _load(name: str, repair: bool) -> tuple[Any, str | None, bool]:
    """(the JSON request, None, whether lone surrogates were replaced), or why not."""
    try:
        with open(name, "rb") as stream:
            data = stream.read()
    except OSError as error:
        return None, f"cannot be read ({error.strerror or error})", False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        where = f"byte 0x{data[error.start]:02x} at offset {error.start}"
        return None, f"not UTF-8 text ({where})", False
    try:
        document = json.loads(text)
    except RecursionError:  # CPython's decoder recurses on nesting
        return None, "nested too deeply", False
    except ValueError as error:  # not JSON, or an integer of over 4300 digits
        return None, f"not JSON ({error})", False
    if not isinstance(document, dict) or not isinstance(document.get("resourceSpans"), list):
        return None, "not an OTLP/JSON request (an object with a resourceSpans list)", False
    repaired = repair and bool(_SURROGATE_ESCAPE.search(text)) and _repair(document)
    return document, None, repaired


def _repair(document: Any) -> bool:
    """Replace lone surrogates by U+FFFD in every string of ``document``, in place (keys
    too); whether there were any. A walk with a stack, not a recursion."""
    changed = False
    stack = [document]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        fixed_keys = False
        for key, value in list(items):
            if isinstance(value, str) and _LONE_SURROGATE.search(value):
                node[key] = _LONE_SURROGATE.sub("\ufffd", value)
                changed = True
            elif isinstance(value, (dict, list)):
                stack.append(value)
            fixed_keys |= isinstance(key, str) and bool(_LONE_SURROGATE.search(key))
        if fixed_keys:
            pairs = [(_LONE_SURROGATE.sub("\ufffd", key), value) for key, value in node.items()]
            node.clear()
            node.update(pairs)
            changed = True
    return changed
