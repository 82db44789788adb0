"""Which frameworks cirron knows, how to detect them, and how their hooks attach.

Detection never imports a framework: a framework the script has already
imported gets its instrumentor now; one that is installed but not imported
gets a post-import hook, so its instrumentor attaches the moment the script
imports it, and never if it doesn't. Instrumentors are loaded by import path
from ``cirron.instrumentors``; the core knows no framework's API.

When several frameworks are in use, the one with the highest ``priority``
owns the semantic ``epoch`` and ``step`` scopes (transformers > tensorflow >
torch); the others yield those names and keep their lower-level scopes.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger("cirron")


@dataclass(frozen=True)
class Framework:
    name: str
    modules: tuple[str, ...]  # importing any of these means the framework is in use
    instrumentor: str  # "module:Class" under cirron.instrumentors
    priority: int


FRAMEWORKS: dict[str, Framework] = {
    framework.name: framework
    for framework in (
        Framework(
            "transformers",
            ("transformers",),
            "cirron.instrumentors.transformers:TransformersInstrumentor",
            3,
        ),
        Framework(
            "tensorflow", ("tensorflow", "keras"), "cirron.instrumentors.keras:KerasInstrumentor", 2
        ),
        Framework("torch", ("torch",), "cirron.instrumentors.torch:TorchInstrumentor", 1),
    )
}


def _installed(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def detect() -> tuple[str, ...]:
    """Names of the frameworks installed here, highest priority first (no imports)."""
    found = [f for f in FRAMEWORKS.values() if any(_installed(m) for m in f.modules)]
    return tuple(f.name for f in sorted(found, key=lambda f: -f.priority))


def in_use(name: str) -> bool:
    return any(module in sys.modules for module in FRAMEWORKS[name].modules)


def load_instrumentor(name: str) -> Any | None:
    """An instance of the framework's instrumentor, or None if it isn't built yet."""
    module_name, _, class_name = FRAMEWORKS[name].instrumentor.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            _log.debug("cirron: no instrumentor for %s in this version", name)
            return None
        raise
    return getattr(module, class_name)()


def when_imported(name: str, attach: Callable[[str], None]) -> None:
    """Call ``attach(name)`` now if the framework is in use, else once it is imported."""
    if in_use(name):
        attach(name)
        return
    import wrapt

    fired = [False]

    def on_import(_module: Any) -> None:
        if not fired[0]:
            fired[0] = True
            attach(name)

    for module in FRAMEWORKS[name].modules:
        wrapt.register_post_import_hook(on_import, module)
