"""Settings of a profiler: one place that resolves each of them.

Order of precedence, for every setting: the explicit argument of
``ci.profile()``, then the ``config=`` dict, then the environment variable,
then the default. A bad argument or ``config=`` value raises a ``ValueError``
or ``TypeError`` that names it; a bad environment value logs a warning and
falls back to the default, as the OpenTelemetry SDK does.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import registry
from .otel import environment as env

_log = logging.getLogger("cirron")

SNAPSHOT_MODES = ("stats", "sampled", "full")
SINK_NAMES = ("spool", "log", "stdout", "none")

# ci.scope nesting deeper than this is not recorded (the user's code still runs).
MAX_SCOPE_DEPTH = 64


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
    # Spans a run records before each later epoch starts a trace of its own (0: never).
    trace_split: int = 10000
    # (K, N): hook spans only for the first K steps of each epoch and every Nth after; None: all.
    step_sampling: tuple[int, int] | None = None
    # The whole config= dict, for the user's own feature flags (Profiler.config).
    config: Mapping[str, Any] = field(default_factory=dict)


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
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


def _sample_rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number between 0 and 1, got {type(value).__name__}")
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
    return float(value)


def _snapshots(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(SNAPSHOT_MODES)}; got {value!r}")
    if value not in SNAPSHOT_MODES:
        raise ValueError(f"{name} must be one of {', '.join(SNAPSHOT_MODES)}; got {value!r}")
    return value


def _path(name: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise ValueError(f"{name} must be a non-empty path, got {value!r}")
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
            raise ValueError(f"invalid {name} value {item!r}; valid values are: {', '.join(valid)}")
    return tuple(dict.fromkeys(items))  # de-duplicated, in order


def _output(name: str, value: Any) -> tuple[str, ...]:
    sinks = _names(name, value, SINK_NAMES)
    return tuple(s for s in sinks if s != "none")


def _frameworks(name: str, value: Any) -> tuple[str, ...]:
    return _names(name, value, tuple(registry.FRAMEWORKS))


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


# setting -> (validator, environment variable, parse env text)
_RULES: dict[str, tuple[Callable[[str, Any], Any], str, Callable[[str], Any]]] = {
    "frameworks": (_frameworks, env.CIRRON_FRAMEWORKS, _split),
    "snapshots": (_snapshots, env.CIRRON_SNAPSHOTS, str.strip),
    "sample_rate": (_sample_rate, env.CIRRON_SAMPLE_RATE, float),
    "flush_interval": (_positive_number, env.CIRRON_FLUSH_INTERVAL, float),
    "path": (_path, env.CIRRON_PATH, str.strip),
    "output": (_output, env.CIRRON_OUTPUT, _split),
    "buffer_size": (_positive_int, env.CIRRON_BUFFER_SIZE, int),
    "trace_buffer": (_positive_int, env.CIRRON_TRACE_BUFFER, int),
    "exit_timeout": (_positive_number, env.CIRRON_EXIT_TIMEOUT, float),
    "max_events": (_positive_int, env.CIRRON_MAX_EVENTS, int),
    "epoch_steps": (_positive_int, env.CIRRON_EPOCH_STEPS, int),
    "spool_max_bytes": (_positive_int, env.CIRRON_SPOOL_MAX_BYTES, int),
    "trace_split": (_count, env.CIRRON_TRACE_SPLIT, int),
    "step_sampling": (_step_sampling, env.CIRRON_STEP_SAMPLING, str.strip),
}


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
    for unknown in set(arguments) - set(_RULES):
        raise TypeError(f"unknown setting {unknown!r}")

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
    if "enabled" in config and enabled is True:
        if not isinstance(config["enabled"], bool):
            raise TypeError("config['enabled'] must be a bool")
        enabled = config["enabled"]
    if sdk_disabled_by_environment() or disabled_by_environment() and "enabled" not in config:
        enabled = False
    return Settings(enabled=enabled, config=dict(config), **resolved)
