"""`kimi-batch publish`: register every Parquet partition in Trino (catch-up after an outage)."""

from __future__ import annotations

from kimi_batch.settings import Settings
from kimi_batch.storage import (
    PublishReport,
    TrinoConfig,
    TrinoPublisher,
)
from kimi_batch.warehouse import open_warehouse

__all__ = ["publish_warehouse"]


def publish_warehouse(settings: Settings) -> PublishReport:
    with TrinoPublisher(TrinoConfig.from_settings(settings)) as publisher:
        return publisher.publish_all(open_warehouse(settings))
