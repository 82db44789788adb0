"""Generators traced by ``ci.inference``: one span per stream, from its first item to its last.

A generator (plain or ``async``) is one span that ends when the stream is
exhausted, closed (``break``, ``aclose()``, garbage collection) or fails, and
records ``gen_ai.response.time_to_first_chunk``. It is the current span only
while the generator's own code runs (:meth:`Stream.enter`/:meth:`Stream.leave`
around each step), never in the consumer's loop: spans the consumer makes
between items are not the stream's. Values sent and thrown in, and the
generator's return value, pass through; cirron's own work on each item is
behind the guard.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any

from opentelemetry.context.context import Context
from opentelemetry.trace import Span

from ..otel import semconv
from ..otel.spans import SPAN_KEY, context_variable
from ..recording import recorder
from ..recording.guard import report
from ..recording.scopes import close_with_error, open_on
from . import capture as content
from .calls import NOTHING, SITE, Spec, disabled, input_of, record_content, start_attributes
from .genai import error_type

_context_var = context_variable()
_time_ns = time.time_ns


class Stream:
    """A generator's call: its span, open from the first item to the last, made current only
    while the generator's own code runs (:meth:`enter`/:meth:`leave` around each step)."""

    __slots__ = ("span", "capture", "given", "started_ns", "first_ns", "pieces", "kept")

    def __init__(self, spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rec = recorder.current or recorder.active()
        self.capture = content.policy(rec)
        self.given = input_of(spec, args, kwargs) if content.captures(self.capture) else None
        self.pieces: list[str] = []  # text items, while capture keeps text
        self.kept = 0  # their characters
        self.first_ns: int | None = None
        opened = open_on(rec, spec.name, start_attributes(spec, args, kwargs), None)
        self.span: Span = opened[0]
        self.started_ns = _time_ns()
        _context_var.reset(opened[1])  # not current between items: that is the consumer's code

    def enter(self) -> Any:
        return _context_var.set(Context({**_context_var.get(), SPAN_KEY: self.span}))

    def leave(self, token: Any) -> None:
        try:
            _context_var.reset(token)
        except (ValueError, RuntimeError):  # another context (a generator moved to another task)
            pass

    def item(self, item: Any) -> None:
        """The generator yielded ``item``."""
        if self.first_ns is None:
            self.first_ns = _time_ns()
        # Past max_chars a margin is kept, so that a secret cut at the edge is still found.
        if self.capture.text and type(item) is str and self.kept < self.capture.max_chars + 1024:
            self.pieces.append(item)
            self.kept += len(item)

    def close(self, error: BaseException | None) -> None:
        """The stream is exhausted (``error`` None), closed early, or failed."""
        span = self.span
        try:
            if self.first_ns is not None:
                first = (self.first_ns - self.started_ns) / 1e9
                span.set_attribute(semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, first)
            if content.captures(self.capture):
                text = "".join(self.pieces) if self.pieces else NOTHING
                record_content(span, self.capture, self.given, text)
            if error is not None:
                span.set_attribute(semconv.ERROR_TYPE, error_type(error))
                close_with_error(span, error)
        finally:
            span.end()


def _open(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Stream | None:
    if disabled():
        return None
    try:
        return Stream(spec, args, kwargs)
    except Exception as failure:  # noqa: BLE001 - the guard: the stream runs untraced
        report(SITE, failure)
        return None


def _step(stream: Stream | None, method: str, *args: Any) -> None:
    """``stream.method(*args)`` behind the guard (nothing when untraced)."""
    if stream is not None:
        try:
            getattr(stream, method)(*args)
        except Exception as failure:  # noqa: BLE001 - the guard: the stream goes on
            report(SITE, failure)


def _enter(stream: Stream | None) -> Any:
    return stream.enter() if stream is not None else None


def _leave(stream: Stream | None, token: Any) -> None:
    if stream is not None:
        stream.leave(token)


def _drive(inner: Generator[Any, Any, Any], spec: Spec, args: Any, kwargs: Any) -> Any:
    """Run ``inner`` item by item inside its span (opened at the first item)."""
    stream = _open(spec, args, kwargs)
    send: Callable[[Any], Any] = inner.send
    sent: Any = None
    while True:
        token = _enter(stream)
        try:
            item = send(sent)
        except StopIteration as stop:
            _leave(stream, token)
            _step(stream, "close", None)
            return stop.value
        except BaseException as error:
            _leave(stream, token)
            _step(stream, "close", error)
            raise
        _leave(stream, token)
        _step(stream, "item", item)
        try:
            sent = yield item
            send = inner.send
        except GeneratorExit:  # closed by the consumer: close the generator inside its span
            token = _enter(stream)
            try:
                inner.close()
            finally:
                _leave(stream, token)
                _step(stream, "close", None)
            raise
        except BaseException as thrown:  # thrown in by the consumer: into the generator
            send, sent = inner.throw, thrown


async def _drive_async(
    inner: AsyncGenerator[Any, Any], spec: Spec, args: Any, kwargs: Any
) -> AsyncGenerator[Any, Any]:
    """:func:`_drive` for an async generator."""
    stream = _open(spec, args, kwargs)
    send: Callable[[Any], Any] = inner.asend
    sent: Any = None
    while True:
        token = _enter(stream)
        try:
            item = await send(sent)
        except StopAsyncIteration:
            _leave(stream, token)
            _step(stream, "close", None)
            return
        except BaseException as error:
            _leave(stream, token)
            _step(stream, "close", error)
            raise
        _leave(stream, token)
        _step(stream, "item", item)
        try:
            sent = yield item
            send = inner.asend
        except GeneratorExit:
            token = _enter(stream)
            try:
                await inner.aclose()
            finally:
                _leave(stream, token)
                _step(stream, "close", None)
            raise
        except BaseException as thrown:
            send, sent = inner.athrow, thrown


def traced_generator(function: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _drive(function(*args, **kwargs), spec, args, kwargs)

    return run


def traced_async_generator(function: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        return _drive_async(function(*args, **kwargs), spec, args, kwargs)

    return run
