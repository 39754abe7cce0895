"""Typed readers of one environment variable each: a bad value is a ConfigError naming it (and
`variable_of`, the variable a `Settings` field is read from)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from datetime import date, time
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from kimi_batch.errors import ConfigError

NumberT = TypeVar("NumberT", int, float)

__all__ = [
    "env_args",
    "env_clock",
    "env_date",
    "env_float",
    "env_int",
    "env_list",
    "env_on",
    "env_optional_int",
    "env_path",
    "env_status",
    "env_str",
    "validation_message",
    "variable_of",
]


def _number(name: str, default: NumberT, parse: Callable[[str], NumberT], kind: str) -> NumberT:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as error:
        raise ConfigError(f"{name} must be {kind}, got {raw!r}") from error


def env_int(name: str, default: int) -> int:
    return _number(name, default, int, "an integer")


def env_float(name: str, default: float) -> float:
    return _number(name, default, float, "a number")


def env_on(name: str, *, default: bool) -> bool:
    """`on` / `off` (also `1`/`0`, `true`/`false`) for a feature switch."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("on", "1", "true", "yes"):
        return True
    if raw in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"{name} must be 'on' or 'off', got {raw!r}")


def env_optional_int(name: str, default: int) -> int | None:
    """An integer, or None when the variable says "off"."""
    if os.environ.get(name, "").strip().lower() == "off":
        return None
    return env_int(name, default)


def env_str(name: str) -> str | None:
    raw = os.environ.get(name, "").strip()
    return raw or None


def env_path(name: str) -> Path | None:
    raw = env_str(name)
    return Path(raw).expanduser().resolve() if raw else None


def env_list(name: str) -> tuple[str, ...]:
    """Whitespace- or comma-separated values."""
    return tuple(item for item in os.environ.get(name, "").replace(",", " ").split() if item)


def env_status(name: str) -> bool:
    """`running` / `stopped` (default) for a sensor or schedule."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "stopped"):
        return False
    if raw == "running":
        return True
    raise ConfigError(f"{name} must be 'running' or 'stopped', got {raw!r}")


def env_args(name: str) -> tuple[str, ...]:
    """Shell-style words (quotes group them)."""
    try:
        return tuple(shlex.split(os.environ.get(name, "")))
    except ValueError as error:
        raise ConfigError(f"{name} cannot be split into arguments ({error})") from error


def env_date(name: str) -> date | None:
    raw = env_str(name)
    if raw is None:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError as error:
        raise ConfigError(f"{name} must be a date YYYY-MM-DD, got {raw!r}") from error


def env_clock(name: str) -> time | None:
    raw = env_str(name)
    if raw is None:
        return None
    try:
        return time.fromisoformat(raw)
    except ValueError as error:
        raise ConfigError(f"{name} must be a time of day HH:MM, got {raw!r}") from error


# Fields whose variable is not KIMI_BATCH_ + the field name in capitals.
_FIELD_VARIABLES = {
    "home": "KIMI_BATCH_HOME",
    "llama_cache_ram_mib": "KIMI_BATCH_LLAMA_CACHE_RAM",
    "inbox_sensor_interval_s": "KIMI_BATCH_INBOX_SENSOR_INTERVAL",
    "inbox_sensor_running": "KIMI_BATCH_INBOX_SENSOR_STATUS",
    "nightly_running": "KIMI_BATCH_NIGHTLY_STATUS",
    "api_sensor_interval_s": "KIMI_BATCH_API_SENSOR_INTERVAL",
}


def variable_of(field: str) -> str:
    """The environment variable a `Settings` field is read from."""
    return _FIELD_VARIABLES.get(field, f"KIMI_BATCH_{field.upper()}")


def validation_message(error: ValidationError) -> str:
    """The first error of a `Settings` validation, naming its variable."""
    item = error.errors()[0]
    field = str(item["loc"][0]) if item["loc"] else ""
    variable = variable_of(field)
    where = ".".join(str(part) for part in item["loc"])
    return f"configuration: {variable} ({where}): {item['msg'].removeprefix('Value error, ')}"
