"""The one guard around foreign ground: hooks, exporters, framework callbacks.

Anything that runs inside the user's training goes through :func:`call_guarded`
(hook spans through the same try/except in their instrumentor): an
``Exception`` is caught, counted in ``ci.health()`` and reported with one
warning per site; the training code carries on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import recorder


def call_guarded(site: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``function``; on an exception, report it for ``site`` and return None."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - this is the guard
        recorder.current_health().failed(site, error)
        return None
