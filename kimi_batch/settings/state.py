"""Where the pipeline's state lives: the warehouse (`KIMI_BATCH_WAREHOUSE`) and, beyond one box,
the state database (`KIMI_BATCH_DATABASE_URL`).

`Settings` inherits this field (one flat contract, one reference table); `state_from_env` reads
it, so `Settings.from_env` stays the one entry point. Unset, the ledger, the leases, the landing
manifest and the Batch API store are SQLite files under the state dir (the embedded default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from kimi_batch.errors import ConfigError
from kimi_batch.settings.environment import env_path, env_str

__all__ = ["StateSettings", "state_from_env"]

_SCHEMES = ("postgresql", "postgres")


class StateSettings(BaseModel):
    """The fields of `Settings` that say where the pipeline's state is kept."""

    warehouse: Path | None = Field(
        default=None,
        description="Parquet warehouse root: a local or mounted folder (object-store URLs are "
        "refused: not supported yet).",
        json_schema_extra={"shown_default": "`$KIMI_BATCH_HOME/warehouse`"},
    )

    database_url: str | None = Field(
        default=None,
        repr=False,  # it may hold a password
        description="A PostgreSQL database (`postgresql://user:password@host:5432/db`) holding "
        "the ledger, the partition leases, the landing manifest and the Batch API store, shared "
        "by run workers on several machines; unset, SQLite files under `KIMI_BATCH_HOME`.",
        json_schema_extra={"shown_default": "unset (SQLite under the state dir)"},
    )

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in _SCHEMES:
            raise ValueError("must be a postgresql:// URL")
        if not parts.path.strip("/"):
            raise ValueError("must name a database (postgresql://host/DATABASE)")
        return value


def state_from_env() -> dict[str, Any]:
    """The state fields' values from the environment (defaults where unset)."""
    warehouse = env_str("KIMI_BATCH_WAREHOUSE")
    if warehouse is not None and "://" in warehouse:
        # A URL read as a path would be a local folder named `s3:`, silently.
        raise ConfigError(
            f"KIMI_BATCH_WAREHOUSE={warehouse}: an object-store warehouse is not supported yet; "
            "use a local or mounted folder"
        )
    return {
        "warehouse": env_path("KIMI_BATCH_WAREHOUSE"),
        "database_url": env_str("KIMI_BATCH_DATABASE_URL"),
    }
