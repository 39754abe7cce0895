"""`kimi-batch publish`: the Trino catalog file of this deployment's Iceberg warehouse.

Trino sees each warehouse commit on its next query, so nothing is registered: what a Trino needs
is its Iceberg catalog file (`scripts/trino.sh` writes the same one for `make trino`).
"""

from __future__ import annotations

from pathlib import Path

from kimi_batch.settings import Settings
from kimi_batch.warehouse import catalog_properties, write_catalog


def publish_catalog(settings: Settings, output: Path | None) -> str:
    """Write the catalog file to `output` (owner-only) and say where; without one, the file's
    text with its secrets masked (a terminal is no place for the database password)."""
    if output is None:
        return catalog_properties(settings, masked=True).rstrip("\n")
    written = write_catalog(settings, output.expanduser().resolve())
    return f"wrote {written} (catalog {written.stem}: put it in Trino's etc/catalog/)"
