"""`TrinoResource`: where to publish the warehouse tables; no host means Parquet only."""

from __future__ import annotations

from typing import Literal

import dagster as dg
from pydantic import Field, SecretStr

from kimi_batch.settings import Settings
from kimi_batch.storage import StorageError, TrinoConfig, TrinoPublisher

__all__ = ["TrinoResource"]

PASSWORD_ENV = "KIMI_BATCH_TRINO_PASSWORD"


class TrinoResource(dg.ConfigurableResource):
    """A Trino coordinator with a Hive-connector catalog over the warehouse (optional)."""

    host: str | None = Field(default=None, description="Coordinator host; None = Parquet only.")
    port: int = Field(default=8080, gt=0, lt=65536)
    user: str = Field(default="kimi_batch")
    password: str | None = Field(
        default=None, description=f"Basic-auth password; pass dg.EnvVar({PASSWORD_ENV!r})."
    )
    catalog: str = Field(default="hive")
    schema_name: str = Field(default="kimi_batch", description="Schema of the output tables.")
    http_scheme: Literal["http", "https"] = "http"
    warehouse_location: str = Field(
        default="local:///", description="The warehouse root as Trino's file system names it."
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> TrinoResource:
        # The password enters as an EnvVar so it never shows up in the run config.
        return cls(
            host=settings.trino_host,
            port=settings.trino_port,
            user=settings.trino_user,
            password=dg.EnvVar(PASSWORD_ENV) if settings.trino_password else None,
            catalog=settings.trino_catalog,
            schema_name=settings.trino_schema,
            http_scheme="https" if settings.trino_password else "http",
            warehouse_location=settings.trino_warehouse_location,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.host)

    def config(self) -> TrinoConfig:
        if not self.host:
            raise StorageError("Trino is not configured (no host): partitions stay Parquet only")
        return TrinoConfig(
            host=self.host,
            port=self.port,
            user=self.user,
            password=SecretStr(self.password) if self.password else None,
            catalog=self.catalog,
            schema_name=self.schema_name,
            http_scheme=self.http_scheme,
            warehouse_location=self.warehouse_location,
        )

    def publisher(self) -> TrinoPublisher:
        """A publisher for this Trino; raises StorageError when no host is configured."""
        return TrinoPublisher(self.config())
