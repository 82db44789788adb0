"""Framework instrumentors: each an OpenTelemetry ``BaseInstrumentor``, and what they share.

They depend on the core (training moments, scopes, marks, the guard), never
the other way, and never on each other. ``cirron.registry`` lists them by
import path; each is imported only once its framework has been imported by
the user's program.

:class:`FrameworkInstrumentor` is the part every one of them needs: with a
user's own provider it records there; it attaches the moment the program
imports the framework (never importing it itself); it patches all or
nothing; ``uninstrument()`` puts every patched attribute back exactly.

May import: every package below it (:mod:`cirron.otel`, :mod:`cirron.recording`,
:mod:`cirron.training`, :mod:`cirron.snapshots`, ...), its own framework (only once the
program has imported it), and modules of this package; never another framework's adapter.
"""

from __future__ import annotations

import abc
import functools
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from .. import registry
from ..recording import recorder
from ..recording.guard import guarded


def around(
    site: str,
    original: Any,
    begin: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
    end: Callable[[Any, BaseException | None], None] | None = None,
) -> Any:
    """``original`` (a framework's method) with cirron's moments around each call.

    ``begin(self, args, kwargs)`` runs before the call and returns a token
    (None: nothing to end); ``end(token, error)`` runs after it, with the
    exception the call raised (None when it returned), before that exception
    reaches the caller unchanged. Both run behind the guard of ``site``; the
    call itself never does.
    """
    begin = guarded(site)(begin)
    finish = guarded(site)(end) if end is not None else None

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = begin(self, args, kwargs)
        if token is None or finish is None:
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as error:
            finish(token, error)
            raise
        finish(token, None)
        return result

    return functools.update_wrapper(method, original)


def flatten(records: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Nested records as one level, keys joined with ``/`` (``{"loss": {"total": x}}`` → ``loss/total``)."""
    flat: dict[str, Any] = {}
    for key, value in records.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


class FrameworkInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """The shared life cycle; a subclass names its framework and fills in :meth:`install`."""

    framework = ""  # its name in cirron.registry, where its modules and requirement stand
    site = ""  # how ci.health() names its hooks' failures, e.g. "torch hook"
    # BaseInstrumentor is a singleton whose __init__ runs on every call of the class, so
    # this state lives on each subclass (see __init_subclass__), not on the instance.
    _patches: list[tuple[Any, str, Any]]
    _installed: set[str]  # the modules install() has patched
    _waiting_for_import: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._patches = []
        cls._installed = set()
        cls._waiting_for_import = False

    @property
    def modules(self) -> tuple[str, ...]:
        """The framework's top-level modules: importing one attaches its hooks
        (``install(module)``), each on its own (Keras 3 as ``keras``, Keras 2 as ``tf_keras``)."""
        return registry.FRAMEWORKS[self.framework].modules

    def instrumentation_dependencies(self) -> Collection[str]:
        return (registry.FRAMEWORKS[self.framework].requirement,)

    # -- what a subclass fills in ------------------------------------------------------------
    @abc.abstractmethod
    def install(self, module: str) -> None:
        """Patch what ``module`` (one of :attr:`modules`, imported by now) holds, with :meth:`patch`."""

    def remove(self) -> None:
        """Undo what :meth:`install` did besides patches (hooks, caches); end its moments."""

    # -- the life cycle ----------------------------------------------------------------------
    def _instrument(self, **kwargs: Any) -> None:
        provider = kwargs.get("tracer_provider")
        if provider is not None and recorder.current is None:
            recorder.bind_provider(provider)
        waiting = [module for module in self.modules if module not in sys.modules]
        if waiting:  # attach the moment the script imports it, never import it ourselves
            import wrapt

            type(self)._waiting_for_import = True
            for module in waiting:
                wrapt.register_post_import_hook(self._attach_on_import, module)
        for module in self.modules:
            if module in sys.modules:
                self._attach(module)

    def _attach_on_import(self, module: Any) -> None:
        if type(self)._waiting_for_import:  # not uninstrumented meanwhile
            self._attach(module.__name__)

    def _attach(self, module: str) -> None:
        if module in self._installed:
            return
        self._installed.add(module)
        try:
            self.install(module)
        except BaseException:
            self._uninstrument()  # all or nothing: never leave a framework half patched
            raise

    def wrap(self, owner: Any, attribute: str, begin: Any, end: Any = None) -> None:
        """Patch ``owner.attribute`` with :func:`around` it (guarded as :attr:`site`)."""
        self.patch(owner, attribute, around(self.site, owner.__dict__[attribute], begin, end))

    def patch(self, owner: Any, attribute: str, replacement: Any) -> None:
        """Replace ``owner.attribute`` (its own, not inherited) until uninstrument()."""
        original = owner.__dict__[attribute]
        self._patches.append((owner, attribute, original))
        setattr(owner, attribute, replacement)

    def _uninstrument(self, **kwargs: Any) -> None:
        type(self)._waiting_for_import = False
        self.remove()
        for owner, attribute, original in reversed(self._patches):
            setattr(owner, attribute, original)
        self._patches.clear()
        self._installed.clear()
