"""Reading the spool back: the one reader of spool files, whatever they hold.

``ci.read_spool``, ``ci.spool_spans`` and every ``cirron`` command read through it.

- **Where.** ``path`` is a cirron directory (``.cirron``: its ``spool/`` holds the files),
  the spool folder itself, or one file. In a folder, the spool files are those named
  ``<pid>-<sequence>.json`` (digits), oldest first per process; any other file (notes, a
  file still being written under its temporary name) is passed over without a word. A
  file named on its own is read whatever its name.
- **A file** must be UTF-8 JSON holding an object with a ``resourceSpans`` list (an
  OTLP/JSON ``ExportTraceServiceRequest``), gzip-compressed or not (told by its first
  bytes, not its name). One that is not (unreadable, not UTF-8, not JSON, nested too
  deeply to parse, another JSON value) is skipped whole, except that a file cut short or
  damaged part way (a truncated file, a corrupt compressed stream) keeps the spans of its
  whole lines before the damage: cirron writes a span a line (:func:`salvage`).
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
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from .otlp_json_decoder import RequestDecoder

SPOOL_FOLDER = "spool"
# <pid>-<sequence>.json, or .json.gz when compressed (the default), matched whole
SPOOL_NAME = re.compile(r"([0-9]+)-([0-9]+)\.json(\.gz)?")
GZIP_MAGIC = b"\x1f\x8b"  # a gzip member begins so, whatever the file is named
_INFLATE_PIECE = 256  # bytes of a damaged stream inflated at a time, to keep what came before
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
                if SPOOL_NAME.fullmatch(entry.name) and _file_like(entry):
                    found.append(entry.path)
    except OSError:  # no such folder (or not one)
        return []
    return sorted(found, key=spool_files_order)


def spool_files_order(name: str) -> tuple[int, int, str]:
    """How :func:`spool_files` orders spool files: by pid, then sequence."""
    match = SPOOL_NAME.fullmatch(os.path.basename(name))
    return (int(match[1]), int(match[2]), name) if match else (-1, -1, name)


def _file_like(entry: os.DirEntry[str]) -> bool:
    """A file, or what cannot even be asked (a symlink loop): then its reading says why."""
    try:
        return entry.is_file()
    except OSError:
        return True


def read_file(
    name: str, *, repair: bool = True, keep: Callable[[dict[str, Any]], bool] | None = None
) -> SpoolFile:
    """The spool file ``name``, read; never raises for what it holds.

    ``repair=False`` keeps every string as written, a lone surrogate included, for a caller
    that hands the JSON on as it is (``ci.read_spool``, ``ci.spool_spans``). ``keep``: a
    span (its OTLP/JSON dict) for which it says False is passed over before it is decoded.
    A ``keep`` with a ``line`` method is asked about each span line of a file cirron wrote
    (a span a line), and a line it says False of is not even parsed.
    """
    return decode_file(name, load_file(name, repair=repair, keep=keep))


Loaded = tuple[Any, Any, bool]  # (the request or None, what was wrong, whether repaired)


def load_file(
    name: str, *, repair: bool = True, keep: Callable[[dict[str, Any]], bool] | None = None
) -> Loaded:
    """The first half of :func:`read_file`: the request of the spool file ``name``, less
    what ``keep`` passes over, not yet decoded (plain JSON: what a worker process hands back),
    with what was wrong and whether it was repaired."""
    with collector_paused():
        document, damage, repaired = _load(name, repair, keep)
        if document is not None and keep is not None:  # (again after its lines: a damaged
            _leave_out(document, keep)  # file was read otherwise)
    return document, damage, repaired


def decode_file(name: str, loaded: Loaded) -> SpoolFile:
    """The second half of :func:`read_file`: the spool file ``name`` of its request as
    :func:`load_file` gave it, decoded."""
    document, damage, repaired = loaded
    if document is None:
        return SpoolFile(name, [], {"resourceSpans": []}, Problem(name, str(damage)))
    with collector_paused():
        decoder = RequestDecoder()
        try:
            spans, request = decoder.decode(document)
        except Exception as error:  # a reader that breaks on a file must not break the rest
            unreadable = Problem(name, f"unreadable ({error!r})")
            return SpoolFile(name, [], {"resourceSpans": []}, unreadable)
    said = [damage] if damage else []
    summary = decoder.summary(len(spans))
    whole = False
    if summary is not None:
        said.append(summary[0])
        whole = summary[1]
    if repaired:
        said.append(_REPAIRED)
    problem = Problem(name, "; ".join(said), whole) if said else None
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


def _leave_out(document: dict[str, Any], keep: Callable[[dict[str, Any]], bool]) -> None:
    """Drop the spans ``keep`` says no to from ``document``, in place (what is not shaped
    as a request is left for the decoder to name)."""
    for resource_spans in document["resourceSpans"]:
        scopes = resource_spans.get("scopeSpans") if isinstance(resource_spans, dict) else None
        for scope_spans in scopes if isinstance(scopes, list) else ():
            spans = scope_spans.get("spans") if isinstance(scope_spans, dict) else None
            if isinstance(spans, list):
                scope_spans["spans"] = [s for s in spans if not isinstance(s, dict) or keep(s)]


def load_request(name: str) -> tuple[dict[str, Any] | None, Problem | None]:
    """The OTLP/JSON request of the spool file ``name``, undecoded (what a file damaged part
    way kept, lone surrogates replaced), and its problem; (None, why) when nothing reads.
    For a reader that takes the spans' fields itself (the Chrome export): a span that does
    not read is its to skip, with :func:`cirron.exporters.otlp_json_decoder.decode_span`."""
    with collector_paused():
        document, damage, repaired = _load(name, True)
    if document is None:
        return None, Problem(name, str(damage))
    said = [damage] if damage else []
    if repaired:
        said.append(_REPAIRED)
    return document, Problem(name, "; ".join(said), False) if said else None


def span_lines(name: str) -> tuple[list[Any], list[str]] | None:
    """(the resource's OTLP/JSON attribute list, the span lines) of a spool file as cirron
    writes it (a span a line), read whole and undamaged, of one resource; None for any other
    file, which :func:`load_request` reads. For a reader that takes a line's fields itself
    (the Chrome export): each line is one span's JSON object."""
    try:
        with open(name, "rb") as stream:
            data = stream.read()
    except OSError:
        return None
    if data[:2] == GZIP_MAGIC:
        data, damage = inflate(data)
        if damage is not None:
            return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")
    resource: list[dict[str, Any]] = []
    if (
        len(lines) < 2
        or not lines[-1].startswith("]")  # the request's end: the file is whole
        or text.count(_RESOURCE_OPEN) != 1
        or _SURROGATE_ESCAPE.search(text)  # (replaced the long way)
        or _open_scope(lines[0], resource) is None
    ):
        return None
    spans = []
    for line in lines[1:-1]:
        if line.startswith(_SPAN_LINE):
            spans.append(line[:-1] if line.endswith(",") else line)
        elif not (line.startswith("]},{") and line.endswith(_SPANS_OPEN)):  # another scope
            return None
    attributes = resource[0]["resource"].get("attributes") if resource[0].get("resource") else []
    return (attributes if isinstance(attributes, list) else []), spans


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


def _load(name: str, repair: bool, keep: Any = None) -> tuple[Any, str | None, bool]:
    """(the JSON request, None, whether lone surrogates were replaced), or why not.

    A file damaged part way gives the request of the spans before the damage, and the
    damage as its reason (``"...; the N whole spans before it read"``).
    """
    try:
        with open(name, "rb") as stream:
            data = stream.read()
    except OSError as error:
        return None, f"cannot be read ({error.strerror or error})", False
    damage = None
    if data[:2] == GZIP_MAGIC:
        data, damage = inflate(data)
    text = data.decode("utf-8", errors="replace") if damage else None
    if text is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            where = f"byte 0x{data[error.start]:02x} at offset {error.start}"
            return None, f"not UTF-8 text ({where})", False
    document: Any = None
    reason = damage
    if damage is None and hasattr(keep, "line"):
        document = _parse_kept_lines(text, keep.line)
    if damage is None and document is None:
        document, reason = _parse(text)
    if reason is not None:
        document = salvage(text, stream=reason.startswith(CORRUPT))
        if document is None:
            return None, reason, False
        count = sum(len(s["spans"]) for r in document["resourceSpans"] for s in r["scopeSpans"])
        reason = f"{reason}; the {count} whole spans before the damage read"
    repaired = repair and bool(_SURROGATE_ESCAPE.search(text)) and _repair(document)
    return document, reason, repaired


def _parse(text: str) -> tuple[Any, str | None]:
    """(the JSON request of ``text``, None), or (None, why not)."""
    try:
        document = json.loads(text)
    except RecursionError:  # CPython's decoder recurses on nesting
        return None, "nested too deeply"
    except ValueError as error:  # not JSON, or an integer of over 4300 digits
        return None, f"not JSON ({error})"
    if not isinstance(document, dict) or not isinstance(document.get("resourceSpans"), list):
        return None, "not an OTLP/JSON request (an object with a resourceSpans list)"
    return document, None


_SPAN_LINE = '{"traceId":"'


def span_line_ids(line: str) -> tuple[str, str | None, str] | None:
    """(span id, parent span id or None, name) of a span line as cirron's encoder writes it
    (trace id, span id, parent id, name first), read without parsing it; None for a line laid
    out otherwise (or a name with an escape in it): parse that one."""
    if line[44:56] != '","spanId":"':
        return None
    span_id = line[56:72]
    if line.startswith(',"parentSpanId":"', 73):
        parent, rest = line[90:106], 107
    else:
        parent, rest = None, 73
    at = line.find(',"name":"', rest)
    end = line.find('"', at + 9)
    if at < 0 or end < 0 or line[end - 1] == "\\":
        return None
    return span_id, parent, line[at + 9 : end]


def _parse_kept_lines(text: str, keep_line: Callable[[str], bool]) -> Any:
    """The request of ``text`` less the span lines ``keep_line`` says False of, unparsed;
    None when that is not a whole request (a file written otherwise, or damaged: then
    :func:`_parse` says what is wrong)."""
    if "\n" not in text:
        return None
    out: list[str] = []
    after_span = False
    for line in text.split("\n"):
        if line.startswith(_SPAN_LINE):
            if not keep_line(line):
                continue
            if after_span:
                out.append(",")
            out.append(line[:-1] if line.endswith(",") else line)
            after_span = True
        else:
            out.append(line)
            after_span = False
    document, reason = _parse("\n".join(out))
    return document if reason is None else None


def inflate(data: bytes) -> tuple[bytes, str | None]:
    """The bytes of the gzip member(s) ``data``, and what was wrong, if anything: a stream
    cut short or corrupt gives what inflated before the damage."""
    out: list[bytes] = []
    while data:
        inflater = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
        try:
            out.append(inflater.decompress(data))
        except zlib.error as error:  # again in small pieces, to keep what came before it
            out.append(_inflated_before_damage(data))
            return b"".join(out), f"{CORRUPT} ({error})"
        if not inflater.eof:
            return b"".join(out), "the compressed stream is cut short"
        data = inflater.unused_data
        if data and data[:2] != GZIP_MAGIC:  # what a gzip reader would call trailing garbage
            return b"".join(out), "bytes that are not gzip after the compressed stream"
    return b"".join(out), None


def _inflated_before_damage(data: bytes) -> bytes:
    """What the gzip member ``data`` inflates to up to the piece where it is damaged."""
    out: list[bytes] = []
    inflater = zlib.decompressobj(wbits=31)
    try:
        for start in range(0, len(data), _INFLATE_PIECE):
            out.append(inflater.decompress(data[start : start + _INFLATE_PIECE]))
    except zlib.error:
        pass
    return b"".join(out)


_MARGIN = 2  # span lines left before the first that does not read, in a corrupt stream
CORRUPT = "a corrupt compressed stream"
# What a line of cirron's spool that opens a scope's spans ends with (see otlp_json).
_SPANS_OPEN = '"spans":['
_RESOURCE_OPEN = '{"resource":'


def salvage(text: str, stream: bool = False) -> dict[str, Any] | None:
    """The request of the whole span lines of ``text``, a spool file cirron wrote (a span a
    line, each scope's resource and scope on the line that opens its spans) that is cut
    short or damaged; None when no span line reads (a file written otherwise).

    ``stream``: ``text`` is what a corrupt compressed stream inflated to. Past the damage it
    is garbage that may still read as JSON, and the damage may begin a line or two before
    the first line that does not read: the spans end :data:`_MARGIN` lines before it.
    """
    resource_spans: list[dict[str, Any]] = []
    spans: list[Any] | None = None  # of the scope being read
    read: list[list[Any]] = []  # the lists spans went into, in order
    for line in text.split("\n"):
        if line.endswith(_SPANS_OPEN):
            spans = _open_scope(line, resource_spans)
            continue
        if spans is None or not line.startswith("{"):
            continue
        try:
            span = json.loads(line[:-1] if line.endswith(",") else line)
        except (ValueError, RecursionError):
            if stream:
                for held in read[-_MARGIN:]:
                    held.pop()
                break
            continue  # the line the damage is in
        if isinstance(span, dict):
            spans.append(span)
            read.append(spans)
    if not any(scope["spans"] for r in resource_spans for scope in r["scopeSpans"]):
        return None
    for entry in resource_spans:
        entry["scopeSpans"] = [scope for scope in entry["scopeSpans"] if scope["spans"]]
    return {"resourceSpans": [entry for entry in resource_spans if entry["scopeSpans"]]}


def _open_scope(line: str, resource_spans: list[dict[str, Any]]) -> list[Any] | None:
    """Read a line that opens a scope's spans (and maybe a resource); the list its spans
    go in, or None when it does not read."""
    at = line.find(_RESOURCE_OPEN)
    try:
        if at >= 0:  # {"resource":{...},"scopeSpans":[{"scope":{...},"spans":[
            entry = json.loads(line[at:] + "]}]}")
            scopes = entry.get("scopeSpans")
            if not isinstance(scopes, list) or len(scopes) != 1:
                return None
            resource_spans.append(entry)
            scope = scopes[0]
        elif resource_spans:  # ]},{"scope":{...},"spans":[
            scope = json.loads(line[line.index("{") :] + "]}")
            resource_spans[-1]["scopeSpans"].append(scope)
        else:
            return None
    except (ValueError, RecursionError):
        return None
    if not isinstance(scope, dict):
        return None
    scope["spans"] = []
    return scope["spans"]  # type: ignore[no-any-return]


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
