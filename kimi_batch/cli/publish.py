"""`kimi-batch publish`: the Trino catalog file of this deployment's Iceberg warehouse.

Trino sees each warehouse commit on its next query, so nothing is registered: what a Trino needs
is its Iceberg catalog file (`scripts/trino.sh` writes the same one for `make trino`).
"""

from __future__ import annotations

from pathlib import Path

from kimi_batch.errors import ConfigError
from kimi_batch.settings import Settings
from kimi_batch.warehouse import catalog_properties, write_catalog


def publish_catalog(settings: Settings, output: Path | None) -> str:
    """Write the catalog file to `output` (owner-only) and say where; without one, the file's
    text with its secrets masked (a terminal is no place for the database password)."""
    if output is None:
        return catalog_properties(settings, masked=True).rstrip("\n")
    target = output.expanduser().resolve()
    if target.is_dir():
        raise ConfigError(f"cannot write the catalog to {target}: it is a folder")
    try:
        written = write_catalog(settings, target)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(f"cannot write the catalog to {target}: {reason}") from error
    return f"wrote {written} (catalog {written.stem}: put it in Trino's etc/catalog/)"
