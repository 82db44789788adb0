"""Which frameworks cirron knows, how to detect them, and how their hooks attach.

Detection never imports a framework: a framework the script has already
imported gets its instrumentor now; one that is installed but not imported
gets a post-import hook, so its instrumentor attaches the moment the script
imports it, and never if it doesn't. Instrumentors are loaded by import path
from ``cirron.instrumentors``; the core knows no framework's API.

Each framework's ``priority`` ranks it as an owner of ``epoch`` and ``step``
(transformers, lightning, trainloop > tensorflow/keras > torch): :mod:`cirron.training` lets the
highest owner at work have them, and the others keep only their lower-level
spans. A framework is this one entry (its instrumentor, its snapshot adapter)
plus its module under ``cirron.instrumentors``; nothing else lists frameworks.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .otel import environment as env

_log = logging.getLogger("cirron")


@dataclass(frozen=True)
class Framework:
    """Everything cirron knows of one framework: adding one is this row, its instrumentor
    module, and its lines in ``pyproject.toml`` (tests/test_registry.py names any missing)."""

    name: str  # as ci.profile(frameworks=[...]) and CIRRON_FRAMEWORKS name it
    modules: tuple[str, ...]  # importing any of these means the framework is in use
    instrumentor: str  # "module:Class" under cirron.instrumentors
    priority: int  # as an owner of epoch and step: higher wins
    snapshot_adapter: str | None = None  # "module:NAME" of its models' snapshot adapter
    extra: str = ""  # the optional dependencies that install it: pip install "cirron-otel[extra]"
    requirement: str = ""  # what its instrumentor needs installed (instrumentation_dependencies)

    @property
    def entry_point(self) -> str:
        """Its name under ``opentelemetry_instrumentor`` (pyproject.toml), as
        ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` names it."""
        return _ENTRY_POINTS.get(self.name, f"cirron_{self.name}")


FRAMEWORKS: dict[str, Framework] = {
    framework.name: framework
    for framework in (
        Framework(
            "torch",
            ("torch",),
            "cirron.instrumentors.torch:TorchInstrumentor",
            priority=1,
            snapshot_adapter="cirron.instrumentors.torch_snapshot:ADAPTER",
            extra="torch",
            requirement="torch >= 2.1",
        ),
        Framework(
            "tensorflow",
            # Keras itself, not tensorflow: `tf.keras` imports it, and tensorflow is imported
            # halfway through `import keras`, when there is nothing to patch yet.
            ("keras", "tf_keras"),
            "cirron.instrumentors.keras:KerasInstrumentor",
            priority=2,
            snapshot_adapter="cirron.instrumentors.keras_snapshot:ADAPTER",
            extra="tensorflow",
            requirement="keras >= 2.15",
        ),
        Framework(
            "lightning",
            ("lightning", "pytorch_lightning"),
            "cirron.instrumentors.lightning:LightningInstrumentor",
            priority=3,
            extra="lightning",
            requirement="lightning >= 2.0",
        ),
        Framework(
            "trainloop",
            ("trainloop",),
            "cirron.instrumentors.trainloop:TrainloopInstrumentor",
            priority=3,
            extra="trainloop",
            requirement="trainloop >= 0.11",
        ),
        Framework(
            "transformers",
            ("transformers",),
            "cirron.instrumentors.transformers:TransformersInstrumentor",
            priority=3,
            extra="transformers",
            requirement="transformers >= 4.40",
        ),
    )
}


_ENTRY_POINTS = {"tensorflow": "cirron_keras"}


def disabled_by_environment() -> set[str]:
    """The frameworks ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` turns off (``*``: all)."""
    names = {
        part.strip()
        for part in os.environ.get(env.PYTHON_DISABLED_INSTRUMENTATIONS, "").split(",")
        if part.strip()
    }
    if "*" in names:
        return set(FRAMEWORKS)
    return {name for name, framework in FRAMEWORKS.items() if framework.entry_point in names}


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


def load_object(path: str) -> Any:
    """The object a ``"module:NAME"`` path names (the module is imported)."""
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def snapshot_adapters() -> list[Any]:
    """The snapshot adapters of the frameworks the program has imported (none imports one).

    Highest priority first: a Keras model on the torch backend is also a
    ``torch.nn.Module``, and Keras names its variables better.
    """
    return [
        load_object(framework.snapshot_adapter)
        for framework in sorted(FRAMEWORKS.values(), key=lambda f: -f.priority)
        if framework.snapshot_adapter is not None and in_use(framework.name)
    ]


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
