"""`TrinoResource`: the Trino that reads the warehouse's Iceberg tables (optional).

Nothing is published to it: Trino reads the tables' catalog and sees each commit on its next
query. The resource names the tables as Trino does (materialization metadata).
"""

from kimi_batch.defs.resources.deployment import DeploymentResource


class TrinoResource(DeploymentResource):
    """A Trino coordinator with an Iceberg catalog over the warehouse (`kimi-batch publish`).

    Host, user and password are deployment configuration (`KIMI_BATCH_TRINO_*`), never run
    config: a run must not be able to send the password to another host.
    """

    @property
    def enabled(self) -> bool:
        return bool(self.settings().trino_host)

    def table_name(self, table: str) -> str:
        settings = self.settings()
        return f"{settings.trino_catalog}.{settings.trino_schema}.{table}"
