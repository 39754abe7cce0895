"""The one `Settings` of the code location being built, handed to the defs modules that need it.

`kimi_batch.definitions` reads the environment once (`Settings.from_env`) and builds the defs
folder inside `building(settings)`; a defs module whose definitions depend on the deployment (the
date partitions' start and timezone, a sensor's default status, the nightly cron) builds them in
its `@dg.definitions` function from `deployment_settings()`. Nothing here reads the environment,
so importing any defs module reads no variable and writes no file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from kimi_batch.errors import ConfigError
from kimi_batch.settings import Settings

_BUILDING: ContextVar[Settings | None] = ContextVar("kimi_batch_deployment", default=None)


@contextmanager
def building(settings: Settings) -> Iterator[Settings]:
    """Build the defs folder for `settings` (what `kimi_batch.definitions` does)."""
    token = _BUILDING.set(settings)
    try:
        yield settings
    finally:
        _BUILDING.reset(token)


def deployment_settings() -> Settings:
    """The Settings of the code location being built; only valid inside `building`."""
    settings = _BUILDING.get()
    if settings is None:
        raise ConfigError(
            "kimi_batch.defs is loaded through kimi_batch.definitions (build_definitions), "
            "which hands it the deployment's Settings"
        )
    return settings
