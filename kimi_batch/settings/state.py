"""Where the pipeline's state lives: the warehouse (`KIMI_BATCH_WAREHOUSE`, a folder or an S3
prefix, and its server `KIMI_BATCH_S3_*`) and, beyond one box, the state database
(`KIMI_BATCH_DATABASE_URL`).

`Settings` inherits these fields (one flat contract, one reference table); `state_from_env` reads
them, so `Settings.from_env` stays the one entry point. Unset, the ledger, the leases, the landing
manifest and the Batch API store are SQLite files under the state dir, and the warehouse a folder
in it (the embedded default). Credentials of the object store are never settings here: the AWS
SDK's own chain reads them (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, a profile, an instance
role), so nothing secret is in the settings, a log line or a command line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from kimi_batch.settings.environment import env_path, env_str

__all__ = ["StateSettings", "object_store_url", "state_from_env"]

_SCHEMES = ("postgresql", "postgres")
# S3's bucket naming rules (3-63 lowercase letters, digits, dots, hyphens) and a prefix of plain
# path segments: what the Hive layout below it and Trino's locations can both name.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*(?:/[A-Za-z0-9][A-Za-z0-9_.=-]*)*$")


def object_store_url(value: str) -> str:
    """`s3://bucket[/prefix]` without a trailing slash; ValueError naming what is wrong."""
    parts = urlsplit(value)
    if parts.scheme != "s3":
        raise ValueError(f"an object-store warehouse must be an s3:// URL, got {value!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError("an s3:// warehouse URL holds a bucket and a prefix only")
    if not _BUCKET.fullmatch(parts.netloc):
        raise ValueError(f"not an S3 bucket name: {parts.netloc!r}")
    prefix = parts.path.strip("/")
    if prefix and not _PREFIX.fullmatch(prefix):
        raise ValueError(f"not a plain prefix (letters, digits, _.=- between slashes): {prefix!r}")
    return f"s3://{parts.netloc}/{prefix}" if prefix else f"s3://{parts.netloc}"


class StateSettings(BaseModel):
    """The fields of `Settings` that say where the pipeline's state is kept."""

    warehouse: Path | str | None = Field(
        default=None,
        description="Parquet warehouse root: a local or mounted folder, or an S3 prefix "
        "(`s3://bucket/prefix`: each partition's versions are objects under it, the current one "
        "named in the ledger's database; credentials from the AWS variables).",
        json_schema_extra={"shown_default": "`$KIMI_BATCH_HOME/warehouse`"},
    )
    s3_endpoint: str | None = Field(
        default=None,
        description="The S3-compatible server of an `s3://` warehouse (`http://127.0.0.1:9000`); "
        "unset, AWS's own (or `AWS_ENDPOINT_URL`).",
    )
    s3_region: str | None = Field(
        default=None,
        description="The region of an `s3://` warehouse's bucket; unset, the AWS SDK's default "
        "(`AWS_REGION`, the profile).",
    )

    database_url: str | None = Field(
        default=None,
        repr=False,  # it may hold a password
        description="A PostgreSQL database (`postgresql://user:password@host:5432/db`) holding "
        "the ledger, the partition leases, the landing manifest and the Batch API store, shared "
        "by run workers on several machines; unset, SQLite files under `KIMI_BATCH_HOME`.",
        json_schema_extra={"shown_default": "unset (SQLite under the state dir)"},
    )

    @field_validator("warehouse")
    @classmethod
    def _warehouse_url(cls, value: Path | str | None) -> Path | str | None:
        return object_store_url(value) if isinstance(value, str) else value

    @field_validator("s3_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s)://host[:port] URL")
        if parts.username or parts.password or parts.path.strip("/") or parts.query:
            # Credentials come from the AWS chain, never from a URL that logs would show.
            raise ValueError("must be http(s)://host[:port] only (no credentials, no path)")
        return f"{parts.scheme}://{parts.netloc}"

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
    return {
        # A URL read as a path would be a local folder named `s3:`, silently: a URL stays one.
        "warehouse": warehouse
        if warehouse is not None and "://" in warehouse
        else env_path("KIMI_BATCH_WAREHOUSE"),
        "s3_endpoint": env_str("KIMI_BATCH_S3_ENDPOINT"),
        "s3_region": env_str("KIMI_BATCH_S3_REGION"),
        "database_url": env_str("KIMI_BATCH_DATABASE_URL"),
    }
