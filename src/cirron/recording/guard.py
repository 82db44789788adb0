"""The one guard around foreign ground: hooks, exporters, framework callbacks.

Anything of cirron's that runs inside the user's training goes through it:
an ``Exception`` is caught, counted in ``ci.health()`` (``hook_errors``, and
per site in ``errors_by_site``), reported with one warning per site, and the
training code carries on. Two forms, one behaviour:

- :func:`guarded` decorates a hook (hot code: one extra call, ~0.1 us)::

      @guarded("torch hook")
      def _before_optimizer_step(optimizer, args, kwargs): ...

- :func:`call_guarded` calls a function once, behind the same guard.

Only cirron's own code goes inside: the user's call that a hook wraps must
run outside the guard, so that its exceptions reach the user unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from . import recorder

F = TypeVar("F", bound=Callable[..., Any])


def report(site: str, error: Exception) -> None:
    """Count ``error`` for ``site`` and warn about the first one there."""
    recorder.current_health().failed(site, error)


def guarded(site: str, fallback: Any = None) -> Callable[[F], F]:
    """Decorate ``function`` so that an ``Exception`` inside is reported and ``fallback`` returned."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def guarded_call(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - this is the guard
                report(site, error)
                return fallback

        return guarded_call  # type: ignore[return-value]

    return decorate


def call_guarded(site: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``function``; on an exception, report it for ``site`` and return None."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - this is the guard
        report(site, error)
        return None
