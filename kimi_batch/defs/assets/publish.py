"""Publishing a partition's tables to Trino: reported as a check, never raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dagster as dg

from kimi_batch.crash_points import crash_point
from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.storage import (
    StorageError,
)
from kimi_batch.warehouse import Warehouse

__all__ = ["publish", "publish_tables"]


def publish(
    context: RunContext,
    trino: TrinoResource,
    warehouse: Warehouse,
    tables: Sequence[str],
    ds: str,
    source: str,
    guard: Callable[[], None] | None = None,
) -> dg.AssetCheckResult:
    """Register the partitions in Trino; a failure is reported, never raised (Parquet landed).

    `guard` (the lease check) runs first: a run that lost the partition publishes nothing.
    """
    check = publish_tables(trino, warehouse, tables, ds, source, guard)
    if not check.passed:
        context.log.warning(
            f"Trino publish failed, run `kimi-batch publish` later ({ds}|{source}): "
            f"{getattr(check.metadata.get('reason'), 'value', '')}"
        )
    return check


def publish_tables(
    trino: TrinoResource,
    warehouse: Warehouse,
    tables: Sequence[str],
    ds: str,
    source: str,
    guard: Callable[[], None] | None = None,
) -> dg.AssetCheckResult:
    """`publish` without the run log: safe to call off the run's thread (the night's
    background publishing), the caller logs the outcome."""
    if guard is not None:
        guard()
    if not trino.enabled:
        return dg.AssetCheckResult(
            check_name="published_to_trino", passed=True, metadata={"trino": "not configured"}
        )
    try:
        with trino.publisher() as publisher:
            for table in tables:
                publisher.publish_partition(warehouse, table, ds, source)
                crash_point("publish.partition_registered")
    except StorageError as error:
        return dg.AssetCheckResult(
            check_name="published_to_trino",
            passed=False,
            metadata={"reason": str(error)[:1000], "catch_up": "kimi-batch publish"},
        )
    return dg.AssetCheckResult(
        check_name="published_to_trino", passed=True, metadata={"tables": ", ".join(tables)}
    )
