"""What pydantic does not read from a variable's text by itself: lists (space or comma
separated), shell-style arguments, paths (`~` expanded, made absolute), `off` for an optional
number, `running`/`stopped` for a switch. Each is a `BeforeValidator` that acts on text only, so
a `Settings` built from Python values keeps them as given.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BeforeValidator


def _text_only(parse: Callable[[str], Any]) -> BeforeValidator:
    return BeforeValidator(lambda value: parse(value.strip()) if isinstance(value, str) else value)


def words(raw: str) -> tuple[str, ...]:
    """Whitespace- or comma-separated values."""
    return tuple(raw.replace(",", " ").split())


def _arguments(raw: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(raw))
    except ValueError as error:
        raise ValueError(f"cannot be split into arguments ({error})") from error


def local_path(raw: str) -> Path:
    """`raw` as an absolute path, `~` expanded. pathlib raises RuntimeError for a `~user` of no
    user (or `~` with no home) and for a symlink loop, which pydantic does not report against the
    variable: a ValueError here, so it is a one-line `ConfigError` naming it."""
    try:
        return Path(raw).expanduser().resolve()
    except RuntimeError as error:
        raise ValueError(f"{raw!r} is not a usable path: {error}") from error


def _running(raw: str) -> bool:
    if raw.lower() not in ("running", "stopped"):
        raise ValueError(f"must be 'running' or 'stopped', got {raw!r}")
    return raw.lower() == "running"


WORDS = _text_only(words)
ARGUMENTS = _text_only(_arguments)
PATH = _text_only(local_path)
PATHS = _text_only(lambda raw: tuple(local_path(item) for item in words(raw)))
OFF_IS_NONE = _text_only(lambda raw: None if raw.lower() == "off" else raw)
RUNNING = _text_only(_running)
