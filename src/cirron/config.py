"""Settings of a profiler: one place that resolves each of them.

Order of precedence, for every setting: the explicit argument of
``ci.profile()``, then the ``config=`` dict, then the environment variable,
then the default. A bad argument or ``config=`` value raises a ``ValueError``
or ``TypeError`` that names it; a bad environment value logs a warning and
falls back to the default, as the OpenTelemetry SDK does.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import registry
from .otel import environment as env

_log = logging.getLogger("cirron")

SNAPSHOT_MODES = ("stats", "sampled", "full")
SPOOL_COMPRESSIONS = ("gzip", "none")
SINK_NAMES = ("spool", "log", "stdout", "none")

# ci.scope nesting deeper than this is not recorded (the user's code still runs).
MAX_SCOPE_DEPTH = 64

CAPTURE_KEYS = ("text", "tensors", "max_chars", "where")  # of capture=
CAPTURE_FORMS = ("span", "event", "both")  # where captured text goes


@dataclass(frozen=True)
class Capture:
    """What inference spans record of a model's inputs and outputs (``capture=``).

    Nothing by default. ``text``: prompts and completions as OpenTelemetry GenAI
    messages, secrets redacted, each text cut to ``max_chars``, as span attributes
    (``where="span"``), one span event (``"event"``) or ``"both"``. ``tensors``:
    the shapes of inputs and outputs, never their values.
    """

    text: bool = False
    tensors: bool = False
    max_chars: int = 2048
    where: str = "span"


NO_CAPTURE = Capture()


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    frameworks: tuple[str, ...] | None = None  # None: detect
    snapshots: str = "stats"
    sample_rate: float = 0.01
    flush_interval: float = 1.0
    path: str = ".cirron"
    output: tuple[str, ...] = ("spool",)
    buffer_size: int = 8192
    trace_buffer: int = 10000
    exit_timeout: float = 3.0
    max_events: int = 10000
    epoch_steps: int = 1000  # optimizer steps per epoch when no DataLoader shows epochs
    spool_max_bytes: int | None = None  # None: the spool may grow until the disk is full
    # Spool files gzip-compressed (.json.gz, about 9x smaller) or plain OTLP/JSON ("none").
    spool_compression: str = "gzip"
    # Spans a run records before each later epoch starts a trace of its own (0: never).
    trace_split: int = 10000
    # (K, N): hook spans only for the first K steps of each epoch and every Nth after; None: all.
    step_sampling: tuple[int, int] | None = None
    # OpenTelemetry metrics derived from the spans (marks, step times, counters) and a system
    # sampler thread (CPU, memory, GPU); off: no metrics and no thread.
    metrics: bool = True
    # Seconds between system samples and between exports of cirron's own metric readers: per-step
    # figures need sub-minute resolution, and a sample costs microseconds.
    metrics_interval: float = 1.0
    # Seconds between steps that carry their CPU time and memory (0: every step): each reading
    # is a system call of microseconds, too many for every short step.
    step_resources_interval: float = 0.1
    # What inference spans record of inputs and outputs (text, tensor shapes); None: not
    # resolved by ci.profile() (a recorder of plain OpenTelemetry), the environment decides.
    capture: Capture | None = None
    # The run's summary on stderr when it ends (cirron.metrics.run_summary); None: on for a
    # terminal when the run writes somewhere.
    run_summary: bool | None = None
    # The whole config= dict, for the user's own feature flags (Profiler.config).
    config: Mapping[str, Any] = field(default_factory=dict)


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _non_negative_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be 0 or a positive number, got {value!r}")
    return float(value)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value!r}")
    return value


def _step_sampling(name: str, value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
        try:
            value = [int(part) for part in value]
        except ValueError:
            raise ValueError(f"{name} must be two ints 'K,N', got {value!r}") from None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise TypeError(f"{name} must be (K, N): full detail for K steps, then every Nth")
    first, every = value
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (first, every)):
        raise TypeError(f"{name} must be two ints (K, N), got {value!r}")
    if first < 0 or every < 1:
        raise ValueError(f"{name} needs K >= 0 and N >= 1, got {value!r}")
    return first, every


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


def flag_text(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``) of a variable."""
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"not one of {', '.join(_TRUE + _FALSE)}")


def _sample_rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number between 0 and 1, got {type(value).__name__}")
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
    return float(value)


def closest(name: str, valid: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the valid name closest to ``name``, or ``''`` if none is."""
    found = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"; did you mean {found[0]!r}?" if found else ""


def _snapshots(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(SNAPSHOT_MODES)}; got {value!r}")
    if value not in SNAPSHOT_MODES:
        raise ValueError(
            f"{name} must be one of {', '.join(SNAPSHOT_MODES)}; got {value!r}"
            + closest(value, SNAPSHOT_MODES)
        )
    return value


def _spool_compression(name: str, value: Any) -> str:
    """``"gzip"`` or ``"none"``; True and False say the same."""
    if isinstance(value, bool):
        return "gzip" if value else "none"
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(SPOOL_COMPRESSIONS)}; got {value!r}")
    text = value.strip().lower()
    if text in _FALSE:
        return "none"
    if text not in SPOOL_COMPRESSIONS:
        raise ValueError(
            f"{name} must be one of {', '.join(SPOOL_COMPRESSIONS)}; got {value!r}"
            + closest(text, SPOOL_COMPRESSIONS)
        )
    return text


def resolve_spool_compression(value: Any) -> str:
    """``spool_compression`` given to an exporter directly (a ``ValueError`` naming it)."""
    return _spool_compression("spool_compression", value)


def path_argument(name: str, value: Any) -> str:
    """``value`` as a path for argument ``name`` (a ``TypeError``/``ValueError`` naming it)."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError(f"{name} must be a non-empty path, got {value!r}")
    if "\0" in text:
        raise ValueError(f"{name} must not contain a NUL character, got {value!r}")
    return text


def _names(name: str, value: Any, valid: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be a string or a list of strings, got {type(value).__name__}")
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{name} must contain strings, got {item!r}")
        if item not in valid:
            raise ValueError(
                f"invalid {name} value {item!r}; valid values are: {', '.join(valid)}"
                + closest(item, valid)
            )
    return tuple(dict.fromkeys(items))  # de-duplicated, in order


def _output(name: str, value: Any) -> tuple[str, ...]:
    sinks = _names(name, value, SINK_NAMES)
    return tuple(s for s in sinks if s != "none")


def _frameworks(name: str, value: Any) -> tuple[str, ...]:
    return _names(name, value, tuple(registry.FRAMEWORKS))


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _capture(name: str, value: Any) -> Capture:
    """``capture=``: a dict of :data:`CAPTURE_KEYS` (``True``: text and tensor shapes)."""
    if isinstance(value, Capture):
        return value
    if isinstance(value, bool):
        return Capture(text=value, tensors=value)
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be a dict such as {{'text': True}}, or True/False; "
            f"got {type(value).__name__}"
        )
    for key in value:
        if key not in CAPTURE_KEYS:
            raise ValueError(
                f"invalid {name} key {key!r}; valid keys are: {', '.join(CAPTURE_KEYS)}"
                + closest(str(key), CAPTURE_KEYS)
            )
    tensors = value.get("tensors", False)
    where = value.get("where", NO_CAPTURE.where)
    if where not in CAPTURE_FORMS:
        raise ValueError(
            f"{name}['where'] must be one of {', '.join(CAPTURE_FORMS)}; got {where!r}"
        )
    return Capture(
        text=_flag(f"{name}['text']", value.get("text", False)),
        tensors=_flag(f"{name}['tensors']", True if tensors == "shapes" else tensors),
        max_chars=_positive_int(f"{name}['max_chars']", value.get("max_chars", 2048)),
        where=where,
    )


def _capture_text(text: str) -> dict[str, Any]:
    """``CIRRON_CAPTURE``: ``text,tensors,max_chars=500,where=event`` (``none``: nothing)."""
    found: dict[str, Any] = {}
    for part in _split(text):
        key, has_value, value = (piece.strip() for piece in part.partition("="))
        if not has_value:
            if key.lower() not in ("none", *_FALSE):
                found["tensors" if key == "shapes" else key] = True
        else:
            found[key] = int(value) if key == "max_chars" else value
    return found


# OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT's values (a boolean in older
# instrumentations) and where each puts the text; None: no text.
_GENAI_CONTENT = {"SPAN_ONLY": "span", "EVENT_ONLY": "event", "SPAN_AND_EVENT": "both",
                  "NO_CONTENT": None}  # fmt: skip


def _message_content_from_environment() -> Capture | None:
    """Text capture as OpenTelemetry's GenAI variable turns it on (None: it does not)."""
    variable = env.INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
    text = os.environ.get(variable, "").strip()
    if not text:
        return None
    if text.upper() in _GENAI_CONTENT:
        where = _GENAI_CONTENT[text.upper()]
    else:
        try:
            where = "span" if flag_text(text) else None
        except ValueError:
            _warn_once(
                variable,
                f"cirron: ignoring {variable}={text!r} (not true, false, "
                f"{', '.join(_GENAI_CONTENT)}); no text is captured",
            )
            return None
    return Capture(text=True, where=where) if where is not None else None


def capture_from_environment() -> Capture:
    """``capture`` from the environment alone: ``CIRRON_CAPTURE``, else OpenTelemetry's
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``, else nothing."""
    found = _from_environment("capture")
    return found or _message_content_from_environment() or NO_CAPTURE


# setting -> (validator, environment variable, parse env text)
_RULES: dict[str, tuple[Callable[[str, Any], Any], str, Callable[[str], Any]]] = {
    "frameworks": (_frameworks, env.CIRRON_FRAMEWORKS, _split),
    "snapshots": (_snapshots, env.CIRRON_SNAPSHOTS, str.strip),
    "sample_rate": (_sample_rate, env.CIRRON_SAMPLE_RATE, float),
    "flush_interval": (_positive_number, env.CIRRON_FLUSH_INTERVAL, float),
    "path": (path_argument, env.CIRRON_PATH, str.strip),
    "output": (_output, env.CIRRON_OUTPUT, _split),
    "buffer_size": (_positive_int, env.CIRRON_BUFFER_SIZE, int),
    "trace_buffer": (_positive_int, env.CIRRON_TRACE_BUFFER, int),
    "exit_timeout": (_positive_number, env.CIRRON_EXIT_TIMEOUT, float),
    "max_events": (_positive_int, env.CIRRON_MAX_EVENTS, int),
    "epoch_steps": (_positive_int, env.CIRRON_EPOCH_STEPS, int),
    "spool_max_bytes": (_positive_int, env.CIRRON_SPOOL_MAX_BYTES, int),
    "spool_compression": (_spool_compression, env.CIRRON_SPOOL_COMPRESSION, str.strip),
    "trace_split": (_count, env.CIRRON_TRACE_SPLIT, int),
    "step_sampling": (_step_sampling, env.CIRRON_STEP_SAMPLING, str.strip),
    "metrics": (_flag, env.CIRRON_METRICS, flag_text),
    "metrics_interval": (_positive_number, env.CIRRON_METRICS_INTERVAL, float),
    "step_resources_interval": (_non_negative_number, env.CIRRON_STEP_RESOURCES_INTERVAL, float),
    "capture": (_capture, env.CIRRON_CAPTURE, _capture_text),
    "run_summary": (_flag, env.CIRRON_RUN_SUMMARY, flag_text),
}


# Every CIRRON_* variable cirron reads (settings, and the platform's ids).
KNOWN_VARIABLES = frozenset(
    value for key, value in vars(env).items() if key.startswith("CIRRON_") and value
)
_warned: set[str] = set()


def _warn_near_misses(config: Mapping[str, Any]) -> None:
    """Warn once per name about ``CIRRON_*`` variables cirron does not read, and about
    ``config=`` keys that are nearly the name of a setting (``flush_intervall``). Other
    keys of ``config=`` are the program's own flags, and stay silent."""
    for variable in sorted(os.environ):
        if variable.startswith("CIRRON_") and variable not in KNOWN_VARIABLES:
            _warn_once(
                variable,
                f"cirron: {variable} is not a variable cirron reads; it is ignored"
                + closest(variable, KNOWN_VARIABLES),
            )
    settings = set(_RULES) | {"enabled"}
    for key in config:
        hint = closest(key, settings) if isinstance(key, str) and key not in settings else ""
        if hint and difflib.SequenceMatcher(None, key, hint.split("'")[1]).ratio() >= 0.85:
            _warn_once(
                f"config:{key}",
                f"cirron: config[{key!r}] is not a setting of cirron (kept as your own flag)"
                + hint,
            )


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        _log.warning("%s", message)


SETTINGS = tuple(_RULES)  # every setting's name, as config= takes it


def _from_environment(setting: str) -> Any:
    validate, variable, parse = _RULES[setting]
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return None
    try:
        return validate(variable, parse(text))
    except (TypeError, ValueError) as error:
        _log.warning("cirron: ignoring %s=%r (%s); using the default", variable, text, error)
        return None


def sdk_disabled_by_environment() -> bool:
    return os.environ.get(env.SDK_DISABLED, "").strip().lower() == "true"


_FALSE = ("false", "0", "no", "off")
_TRUE = ("true", "1", "yes", "on")


def disabled_by_environment() -> bool:
    """``CIRRON_ENABLED`` says no (a bad value warns and is ignored)."""
    text = os.environ.get(env.CIRRON_ENABLED, "").strip().lower()
    if text and text not in _FALSE + _TRUE:
        _log.warning(
            "cirron: ignoring %s=%r (not one of %s); using the default",
            env.CIRRON_ENABLED,
            text,
            ", ".join(_TRUE + _FALSE),
        )
    return text in _FALSE


def resolve(config: Mapping[str, Any] | None, enabled: Any, **arguments: Any) -> Settings:
    """Resolve every setting: argument > ``config=`` > environment > default."""
    if config is None:
        config = {}
    elif not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    for unknown in sorted(set(arguments) - set(_RULES)):
        raise TypeError(f"unknown setting {unknown!r}" + closest(unknown, _RULES))
    _warn_near_misses(config)

    resolved: dict[str, Any] = {}
    for setting, (validate, _variable, _parse) in _RULES.items():
        if arguments.get(setting) is not None:
            resolved[setting] = validate(setting, arguments[setting])
        elif config.get(setting) is not None:
            resolved[setting] = validate(f"config[{setting!r}]", config[setting])
        else:
            value = _from_environment(setting)
            if value is not None:
                resolved[setting] = value
    if "capture" not in resolved:  # OpenTelemetry's GenAI variable, below CIRRON_CAPTURE
        resolved["capture"] = _message_content_from_environment() or NO_CAPTURE
    if "enabled" in config and enabled is True:
        if not isinstance(config["enabled"], bool):
            raise TypeError("config['enabled'] must be a bool")
        enabled = config["enabled"]
    if sdk_disabled_by_environment() or disabled_by_environment() and "enabled" not in config:
        enabled = False
    return Settings(enabled=enabled, config=dict(config), **resolved)
