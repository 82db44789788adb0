"""The one guard around foreign ground: hooks, exporters, framework callbacks.

Anything that runs inside the user's training goes through :func:`call_guarded`
or :func:`traced_call`: an ``Exception`` is caught, counted in ``ci.health()``
and reported with one warning per site; the training code carries on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import recorder
from .scopes import close_span, open_span


def call_guarded(site: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``function``; on an exception, report it for ``site`` and return None."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - this is the guard
        recorder.current_health().failed(site, error)
        return None


def traced_call(
    site: str,
    name: str,
    attributes: dict[str, Any],
    function: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``function`` inside a scope ``name``; the scope can never break the call.

    If opening or closing the scope fails, that is counted for ``site`` and the
    call runs (or its result is returned) as if cirron were not there. The
    call's own exceptions propagate unchanged, recorded on the scope.
    """
    try:
        opened = open_span(name, attributes)
    except Exception as error:  # noqa: BLE001 - this is the guard
        recorder.current_health().failed(site, error)
        opened = None
    if opened is None:
        return function(*args, **kwargs)
    try:
        result = function(*args, **kwargs)
    except BaseException as raised:
        call_guarded(site, close_span, opened, raised)
        raise
    try:
        close_span(opened)
    except Exception as error:  # noqa: BLE001 - this is the guard
        recorder.current_health().failed(site, error)
    return result
