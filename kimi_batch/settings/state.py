"""Where the pipeline's state lives: the warehouse (`KIMI_BATCH_WAREHOUSE`: a folder, or an
`s3://` URL with `KIMI_BATCH_S3_ENDPOINT`/`_REGION`) and, beyond one box, the state database
(`KIMI_BATCH_DATABASE_URL`). Object-store credentials are never settings: the S3 clients (and
`scripts/trino.sh`) read the usual `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` themselves.

`Settings` inherits these fields (one flat contract, one reference table), and `Settings.from_env`
reads them with the rest. Unset, the ledger, the leases, the landing
manifest and the Batch API store are SQLite files under the state dir (the embedded default).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

_SCHEMES = ("postgresql", "postgres")


class StateSettings(BaseModel):
    """The fields of `Settings` that say where the pipeline's state is kept."""

    warehouse: Path | str | None = Field(
        default=None,
        description="Parquet warehouse root: a local or mounted folder, or an object-store "
        "prefix `s3://bucket/prefix` (credentials from `AWS_ACCESS_KEY_ID` and "
        "`AWS_SECRET_ACCESS_KEY`).",
        json_schema_extra={"shown_default": "`$KIMI_BATCH_HOME/warehouse`"},
    )
    s3_endpoint: str | None = Field(
        default=None,
        description="The S3 endpoint of an `s3://` warehouse (`http://127.0.0.1:9000` for an "
        "S3-compatible server); unset, AWS.",
    )
    s3_region: str | None = Field(
        default=None, description="The S3 region of an `s3://` warehouse; unset, the client's."
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
    def _folder_or_s3(cls, value: Path | str | None) -> Path | str | None:
        if not isinstance(value, str):
            return value
        if "://" not in value:
            return Path(value).expanduser().resolve()
        parts = urlsplit(value)
        if parts.scheme != "s3" or not parts.netloc:
            # A URL read as a path would be a local folder named `gs:`, silently.
            raise ValueError("must be a folder or an s3://bucket/prefix URL")
        return value.rstrip("/")

    @field_validator("s3_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @property
    def warehouse_url(self) -> str | None:
        """The object-store warehouse's `s3://` URL; None for a folder."""
        return self.warehouse if isinstance(self.warehouse, str) else None

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
