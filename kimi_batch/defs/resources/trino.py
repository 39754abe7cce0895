"""`TrinoResource`: where to publish the warehouse tables; no host means Parquet only."""

from kimi_batch.defs.resources.deployment import DeploymentResource
from kimi_batch.storage import TrinoConfig, TrinoPublisher

__all__ = ["TrinoResource"]


class TrinoResource(DeploymentResource):
    """A Trino coordinator with a Hive-connector catalog over the warehouse (optional).

    Host, user and password are deployment configuration (`KIMI_BATCH_TRINO_*`), never run
    config: a run must not be able to send the password to another host.
    """

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
