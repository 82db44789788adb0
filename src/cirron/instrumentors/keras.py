"""Keras instrumentation: a ``keras.callbacks.Callback`` that reports training moments.

Installed by ``ci.profile()`` once the script imports keras (or reaches
``tf.keras``), or on its own with plain OpenTelemetry::

    from cirron.instrumentors.keras import KerasInstrumentor
    KerasInstrumentor().instrument(tracer_provider=provider)

Keras 3 on any backend (TensorFlow, PyTorch, JAX) as ``keras`` or
``tf.keras``, and Keras 2 as ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``).
``Model.fit``, ``evaluate`` and ``predict`` get one cirron callback appended
to the user's (theirs are kept, in their order; a ``CallbackList`` gets it
added once). What becomes a span:

- ``train``: one ``fit()``, with ``epochs`` and ``steps`` (batches per epoch)
  when Keras knows them.
- ``epoch`` (Keras's epoch number, so ``initial_epoch`` counts) and
  ``batch`` (training batches only, numbered from 0 in each epoch), owned by
  Keras: the torch hooks of the torch backend yield both and keep their
  ``forward``/``backward`` inside the batch. Each batch's logged values are
  point marks on it; the epoch's logs (``loss``, every metric, every
  ``val_*``, what ``History`` records) are summary marks on the epoch.
- ``validate`` (validation inside ``fit``, a child of its epoch, with the
  epoch's ``index``), ``evaluate`` (``evaluate()`` on its own) and
  ``predict``, each with ``batches``; an evaluation's metrics are summary
  marks on it.
- The model is watched for snapshots with no ``ci.watch``: one per epoch,
  at its end, each variable under its path (see
  :mod:`cirron.instrumentors.keras_snapshot`).
- A loop of the user's own over ``train_on_batch`` / ``test_on_batch`` gets
  its steps and evaluation passes (see :mod:`cirron.instrumentors.keras_batches`),
  and a TensorFlow custom training loop (``tf.data``, ``tf.GradientTape``, the
  optimizer's ``apply_gradients``) its epochs, steps, forwards, backwards and
  fetches (see :mod:`cirron.instrumentors.keras_custom_loops`).

A call that raises ends what it opened with the error recorded, and the
error reaches the user unchanged. Every callback runs behind the core guard:
a failure inside cirron is counted in ``ci.health()`` and training goes on.
``uninstrument()`` restores every patched method; callbacks already handed
to Keras go quiet. This module imports Keras only when it instruments.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from .. import training
from ..otel import semconv
from ..recording import recorder
from ..recording.guard import guarded
from ..snapshots.watch import watch_for_run
from ..training.callbacks import FrameworkRun, Switch
from . import FrameworkInstrumentor, keras_batches, keras_custom_loops

_SITE = "keras hook"
KERAS = training.owner("tensorflow")
ACTIVE = Switch()  # the instrumentor is on: callbacks handed out earlier go quiet
_fitting: list[FrameworkRun] = []  # runs inside fit() now (ended if the hooks come off)


def _new_run() -> FrameworkRun:
    return FrameworkRun(KERAS, _SITE)


@guarded(_SITE)
def _train_begin(run: FrameworkRun, params: Any, model: Any) -> None:
    run.begin(hold=False)  # (a fit() that cirron did not patch, with our callback in it)
    values = {name: (params or {}).get(name) for name in ("epochs", "steps")}
    run.describe({name: value for name, value in values.items() if isinstance(value, int)})
    if model is not None:
        run.watching(watch_for_run(model))


def _train_end(run: FrameworkRun, error: BaseException | None = None) -> None:
    run.end(error)
    if run in _fitting:
        _fitting.remove(run)


def _make_callback_class(base: Any) -> Any:
    class CirronCallback(base):  # type: ignore[misc, valid-type]
        """cirron's callback: reports Keras's moments (see the module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self.run = _new_run()

        def on_train_begin(self, logs: Any = None) -> None:
            if ACTIVE:
                _train_begin(self.run, self.params, self.model)

        def on_train_end(self, logs: Any = None) -> None:
            if ACTIVE:
                _train_end(self.run)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if ACTIVE:
                self.run.begin_epoch(int(epoch))

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if ACTIVE:
                self.run.end_epoch(summary=logs)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if ACTIVE:
                self.run.begin_step(int(batch), name=semconv.BATCH)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if ACTIVE:
                self.run.end_step(logs)

        def on_test_begin(self, logs: Any = None) -> None:
            if ACTIVE:  # inside any fit(): a validation pass of its epoch
                self.run.begin_pass(semconv.EVALUATE, during_training=bool(_fitting))

        def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
            if ACTIVE:
                self.run.count_batch()

        def on_test_end(self, logs: Any = None) -> None:
            if ACTIVE:
                self.run.end_pass(summary=logs)

        def on_predict_begin(self, logs: Any = None) -> None:
            if ACTIVE:
                self.run.begin_pass(semconv.PREDICT)

        def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
            if ACTIVE:
                self.run.count_batch()

        def on_predict_end(self, logs: Any = None) -> None:
            if ACTIVE:
                self.run.end_pass()

    CirronCallback.__qualname__ = CirronCallback.__name__
    return CirronCallback


class Flavor:
    """One Keras as the script imported it (``keras`` or ``tf_keras``): what the patches need."""

    def __init__(self, module: Any) -> None:
        callbacks = module.callbacks
        self.callback_list = callbacks.CallbackList
        self.callback_class = _make_callback_class(callbacks.Callback)

    def ours(self, callbacks: Any) -> Any:
        """cirron's callback among ``callbacks`` (a list), or None."""
        for callback in callbacks:
            if isinstance(callback, self.callback_class):
                return callback
        return None

    def with_ours(self, callbacks: Any) -> tuple[Any, FrameworkRun]:
        """``callbacks`` as the user gave them, plus cirron's (once); and its run.

        A user's list is never changed (a new one is passed on); a
        ``CallbackList`` gets ours added, with its model and parameters, and
        its batch-end calls kept on the training thread (ours opens spans there).
        """
        if isinstance(callbacks, self.callback_list):
            callback = self.ours(callbacks.callbacks)
            if callback is None:
                callback = self.callback_class()
                callbacks.callbacks.append(callback)
                if getattr(callbacks, "model", None) is not None:
                    callback.set_model(callbacks.model)
                if getattr(callbacks, "params", None):
                    callback.set_params(callbacks.params)
                for dispatch in ("_async_train", "_async_test", "_async_predict"):
                    if getattr(callbacks, dispatch, False):
                        setattr(callbacks, dispatch, False)
            return callbacks, callback.run
        if callbacks is None:
            given = []
        elif isinstance(callbacks, (list, tuple)):
            given = list(callbacks)
        else:  # one callback on its own, as Keras also takes it
            given = [callbacks]
        callback = self.ours(given)
        if callback is None:
            callback = self.callback_class()
            given.append(callback)
        return given, callback.run


@guarded(_SITE)
def _inject(
    flavor: Flavor, position: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], FrameworkRun]:
    """The call's arguments with cirron's callback among its ``callbacks``."""
    if len(args) > position:
        callbacks, run = flavor.with_ours(args[position])
        args = args[:position] + (callbacks,) + args[position + 1 :]
    else:
        kwargs = dict(kwargs)
        kwargs["callbacks"], run = flavor.with_ours(kwargs.get("callbacks"))
    return args, kwargs, run


@guarded(_SITE)
def _abort(run: FrameworkRun, error: BaseException, fit: bool) -> None:
    """The call raised: what it opened ends, with ``error`` recorded."""
    if fit:
        _train_end(run, error)
    else:
        while run.passes:
            run.end_pass(error)


def _entry(flavor: Flavor, name: str, original: Any) -> Any:
    """A patched ``fit``/``evaluate``/``predict``: the call with cirron's callback in it."""
    position = list(inspect.signature(original).parameters).index("callbacks") - 1  # self
    fit = name == "fit"

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        injected = _inject(flavor, position, args, kwargs) if ACTIVE else None
        if injected is None:
            return original(self, *args, **kwargs)
        args, kwargs, run = injected
        _hold()
        if fit:  # the set-up, the model's build, then the epochs: all inside `train`
            run.begin(hold=False)  # (held around every call, evaluate's and predict's too)
            _fitting.append(run)
        try:
            return original(self, *args, **kwargs)
        except BaseException as error:
            _abort(run, error, fit)
            raise
        finally:
            _release()
            if fit and run.train is not None:  # no on_train_end (a callback list ran none)
                _train_end(run)

    method.__wrapped__ = original  # type: ignore[attr-defined]
    method.__name__ = original.__name__
    method.__qualname__ = original.__qualname__
    method.__doc__ = original.__doc__
    return method


_hold = guarded(_SITE)(lambda: training.hold(KERAS))
_release = guarded(_SITE)(lambda: training.release(KERAS))


def _layer_call(original: Any) -> Any:
    """``Layer.__call__`` on the torch backend: the torch hooks take no step from it.

    Keras layers are torch modules there; their forwards are still spans, but
    a layer called outside ``fit`` (a model being built, shapes being traced)
    is Keras's work, not a step of a torch loop.
    """

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not ACTIVE or recorder.current is None:
            return original(self, *args, **kwargs)
        _hold()
        try:
            return original(self, *args, **kwargs)
        finally:
            _release()

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


def _train_batch_begins(model: Any, args: Any, kwargs: Any) -> bool | None:
    return keras_batches.train_batch_begins(KERAS) if ACTIVE else None


def _train_batch_ends(token: Any, error: BaseException | None) -> None:
    keras_batches.train_batch_ends(KERAS, error)


def _test_batch_begins(model: Any, args: Any, kwargs: Any) -> bool | None:
    return keras_batches.test_batch_begins(KERAS) if ACTIVE else None


def _test_batch_ends(token: Any, error: BaseException | None) -> None:
    keras_batches.test_batch_ends(KERAS, error)


class KerasInstrumentor(FrameworkInstrumentor):
    """OpenTelemetry instrumentor for Keras (see the module docstring)."""

    framework = "tensorflow"
    site = _SITE

    def install(self, module: str) -> None:
        keras = sys.modules[module]
        flavor = Flavor(keras)
        for name in ("fit", "evaluate", "predict"):
            # Keras 3 defines them on its backend's trainer class, a base of Model
            owner = next(klass for klass in keras.Model.__mro__ if name in klass.__dict__)
            self.patch(owner, name, _entry(flavor, name, owner.__dict__[name]))
        for name, begin, end in (
            ("train_on_batch", _train_batch_begins, _train_batch_ends),
            ("test_on_batch", _test_batch_begins, _test_batch_ends),
        ):
            owner = next(klass for klass in keras.Model.__mro__ if name in klass.__dict__)
            self.wrap(owner, name, begin, end)
        backend = getattr(getattr(keras, "backend", None), "backend", None)
        if callable(backend) and backend() == "torch":
            owner = next(klass for klass in keras.Layer.__mro__ if "__call__" in klass.__dict__)
            self.patch(owner, "__call__", _layer_call(owner.__dict__["__call__"]))
        elif callable(backend) and backend() == "tensorflow" and module == "keras":
            keras_custom_loops.install(self, sys.modules["tensorflow"], keras)
        ACTIVE.on = True

    def remove(self) -> None:
        ACTIVE.on = False
        if recorder.current is not None:
            for run in list(_fitting):
                _train_end(run)
            guarded(_SITE)(keras_batches.end_moments)(KERAS)
            guarded(_SITE)(keras_custom_loops.end_moments)()
        _fitting.clear()
