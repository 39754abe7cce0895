"""`kimi-batch publish`: register every Parquet partition in Trino (catch-up after an outage)."""

from __future__ import annotations

from kimi_batch.settings import Settings
from kimi_batch.storage import PublishReport, StorageError, TrinoConfig, TrinoPublisher, Warehouse

__all__ = ["publish_warehouse", "trino_config"]


def trino_config(settings: Settings) -> TrinoConfig:
    if not settings.trino_host:
        raise StorageError("KIMI_BATCH_TRINO_HOST is not set: nothing to publish to")
    return TrinoConfig(
        host=settings.trino_host,
        port=settings.trino_port,
        user=settings.trino_user,
        password=settings.trino_password,  # type: ignore[arg-type]  # pydantic coerces to SecretStr
        http_scheme="https" if settings.trino_password else "http",
        catalog=settings.trino_catalog,
        schema_name=settings.trino_schema,
        warehouse_location=settings.trino_warehouse_location,
    )


def publish_warehouse(settings: Settings) -> PublishReport:
    with TrinoPublisher(trino_config(settings)) as publisher:
        return publisher.publish_all(Warehouse(settings.warehouse_dir))
