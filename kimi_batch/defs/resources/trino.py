"""`TrinoResource`: where to publish the warehouse tables; no host means Parquet only."""

# No `from __future__ import annotations`: Dagster reads the `ResourceDependency` annotation
# of `deployment` when the class is made, and a string would not be one.

import dagster as dg
from pydantic import Field

from kimi_batch.settings import Settings
from kimi_batch.storage import TrinoConfig, TrinoPublisher

__all__ = ["TrinoResource"]


class TrinoResource(dg.ConfigurableResource):
    """A Trino coordinator with a Hive-connector catalog over the warehouse (optional).

    Host, user and password are deployment configuration (`KIMI_BATCH_TRINO_*`), never run
    config: a run must not be able to send the password to another host.
    """

    deployment: dg.ResourceDependency[Settings] = Field(
        description="The deployment's settings (KIMI_BATCH_*), built once per process."
    )

    def settings(self) -> Settings:
        return self.deployment

    @property
    def enabled(self) -> bool:
        return bool(self.settings().trino_host)

    def table_name(self, table: str) -> str:
        settings = self.settings()
        return f"{settings.trino_catalog}.{settings.trino_schema}.{table}"

    def config(self) -> TrinoConfig:
        return TrinoConfig.from_settings(self.settings())

    def publisher(self) -> TrinoPublisher:
        """A publisher for this Trino; raises StorageError when no host is configured."""
        return TrinoPublisher(self.config())
