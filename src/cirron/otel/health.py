"""Counters behind ``ci.health()``, and the warn-once reporting of failures.

Counters on the hot path (spans started/ended) are ``itertools.count``
objects: ``next()`` on them is atomic under the GIL, so threads never lose an
increment and need no lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

LINE_TEXT_LIMIT = 200  # characters of one name or value in a line; the rest is cut
_log = logging.getLogger("cirron")
_ERROR_TEXT_LIMIT = 500  # characters of an error's text in a warning or last_export_error


def printable(text: str, limit: int = LINE_TEXT_LIMIT) -> str:
    """``text`` safe for one line: cut at ``limit`` characters, control characters escaped."""
    if len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return text.encode("unicode_escape").decode("ascii")


def _value(counter: itertools.count) -> int:
    # An itertools.count can't be read without advancing it; its repr, "count(5)",
    # carries the next value (its pickle form did too, but Python 3.12 deprecates that
    # and 3.14 removes it).
    return int(repr(counter)[6:-1])


class Health:
    """What went right and wrong for one profiler (or the in-memory recorder)."""

    def __init__(self) -> None:
        # Advanced by the span processor on the training thread, lock-free.
        self.started = itertools.count()
        self.ended = itertools.count()
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {
            "spans_exported": 0,
            "spans_dropped": 0,
            "marks_dropped": 0,
            "marks_invalid": 0,
            "scopes_too_deep": 0,
            "hook_errors": 0,
            "export_errors": 0,
            "snapshot_files_lost": 0,
            "snapshots_skipped": 0,
            "threads_restarted": 0,
        }
        self.errors_by_site: dict[str, int] = {}
        self.last_export_error: str | None = None
        self._warned: set[str] = set()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self.counts[name] += amount

    def warn_once(self, site: str, message: str, *args: Any) -> None:
        """Log ``message`` the first time ``site`` reports, then stay quiet."""
        with self._lock:
            if site in self._warned:
                return
            self._warned.add(site)
        _log.warning(message, *args)

    def failed(
        self, site: str, error: BaseException, counter: str = "hook_errors", warn: bool = True
    ) -> str:
        """Count a failure of our own code at ``site``, warn once about it; returns its text.

        ``warn=False``: the caller reports it (a sink, in its one warning about losses).
        """
        # One line, bounded: an error's text may carry a user's hostile value.
        text = printable(f"{type(error).__name__}: {error}", _ERROR_TEXT_LIMIT)
        with self._lock:
            self.counts[counter] += 1
            self.errors_by_site[site] = self.errors_by_site.get(site, 0) + 1
            if counter == "export_errors":
                self.last_export_error = f"{site}: {text}"
        if warn:
            self.warn_once(
                site,
                "cirron: %s failed (%s); training continues, further errors here are "
                "only counted in ci.health()",
                site,
                text,
            )
        return text

    def spans_started(self) -> int:
        return _value(self.started)

    def thread_restarted(self, thread: str, error: BaseException) -> None:
        """A thread of ours died (an exporter's ``SystemExit``, killed from outside) and was replaced."""
        self.add("threads_restarted")
        self.warn_once(
            f"restart-{thread}",
            "cirron: thread %s died (%s: %s) and was restarted; training is unaffected, "
            "restarts are counted in ci.health()['threads_restarted']",
            thread,
            type(error).__name__,
            error,
        )

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            report: dict[str, Any] = dict(self.counts)
            report["errors_by_site"] = dict(self.errors_by_site)
            report["last_export_error"] = self.last_export_error
        report["spans_started"] = _value(self.started)
        report["spans_ended"] = _value(self.ended)
        return report
