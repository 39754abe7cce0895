"""Trino catch-up: partitions whose publishing failed are published by themselves once Trino is back.

A Trino outage does not fail a run (its Parquet landed), it fails the asset's `published_to_trino`
check. `trino_catch_up` reads those failed checks from Dagster's own per-partition check state
every few minutes, publishes each such partition's tables (under the partition's lease, so never
beside a run writing it) and records the check as passed; while Trino is still down it logs and
tries again next tick. `kimi-batch publish` stays the by-hand equivalent.

Starts running when `KIMI_BATCH_TRINO_HOST` is set (it writes nothing but Trino metadata and check
results), stopped otherwise.
"""

from __future__ import annotations

import dagster as dg

from kimi_batch.defs.check_states import PUBLISHED_CHECK, failed_checks, published_checks
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.partitions import split_partition_key
from kimi_batch.defs.stages import SEED_ASSET, SEED_TABLES, STAGE_DECLARATIONS
from kimi_batch.engine import LeaseHeldError, Ledger
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    StorageError,
    TrinoConfig,
    TrinoPublisher,
    TrinoUnavailableError,
)
from kimi_batch.warehouse import open_warehouse

__all__ = ["build_trino_catch_up", "defs", "tables_of"]

CATCH_UP_INTERVAL_S = 300
OWNER = "trino_catch_up"


def tables_of(asset: str) -> tuple[str, ...]:
    """What `asset` publishes (the same tables its own `published_to_trino` check covers)."""
    return SEED_TABLES if asset == SEED_ASSET else STAGE_DECLARATIONS[asset].tables


def _parts(partition: str) -> tuple[str, str]:
    parts = split_partition_key(partition)
    if parts is None:
        raise ValueError(f"not a date|source partition: {partition!r}")
    return parts


def _published(asset: str, partition: str, tables: tuple[str, ...]) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(asset),
        check_name=PUBLISHED_CHECK,
        passed=True,
        partition=partition,
        metadata={"tables": ", ".join(tables), "published_by": OWNER},
    )


def build_trino_catch_up(settings: Settings) -> dg.SensorDefinition:
    """The Trino catch-up sensor of the deployment `settings` (running when Trino is set)."""

    @dg.sensor(
        name=OWNER,
        minimum_interval_seconds=CATCH_UP_INTERVAL_S,
        default_status=(
            dg.DefaultSensorStatus.RUNNING
            if settings.trino_host
            else dg.DefaultSensorStatus.STOPPED
        ),
        description="Publishes to Trino every partition whose published_to_trino check failed (a "
        "Trino outage during its run), once Trino answers again, and marks the check passed.",
    )
    def trino_catch_up(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        """Publish what an outage left unpublished."""
        if not settings.trino_host:
            return dg.SkipReason("no KIMI_BATCH_TRINO_HOST: Parquet only")
        return _catch_up(context, settings)

    return trino_catch_up


def _catch_up(
    context: dg.SensorEvaluationContext, settings: Settings
) -> dg.SensorResult | dg.SkipReason:
    missing = failed_checks(context.instance, keys=published_checks())
    if not missing:
        return dg.SkipReason("every partition is published")
    warehouse = open_warehouse(settings)
    done: list[dg.AssetCheckEvaluation] = []
    with TrinoPublisher(TrinoConfig.from_settings(settings)) as publisher:
        for item in missing:
            ds, source = _parts(item.partition)
            tables = tables_of(item.asset)
            try:
                # The lease key of the partition's runs (defs/assets/lease.py).
                with (
                    Ledger(settings.paths.ledger_state) as ledger,
                    ledger.lease(f"{ds}|{source}", OWNER, wait_s=0.0),
                ):
                    for table in tables:
                        publisher.publish_partition(warehouse, table, ds, source)
            except LeaseHeldError:
                context.log.info(f"{item.partition} is being written by a run; next tick")
                continue
            except TrinoUnavailableError as error:
                context.log.warning(f"Trino is still unreachable, next tick: {error}")
                break  # the other partitions would fail the same way
            except StorageError as error:
                context.log.warning(f"Trino publish of {item.partition} failed: {error}")
                continue
            done.append(_published(item.asset, item.partition, tables))
    context.log.info(f"published {len(done)} of {len(missing)} unpublished partition(s)")
    return dg.SensorResult(asset_events=done)


@dg.definitions
def defs() -> dg.Definitions:
    """The Trino catch-up sensor of this code location."""
    return dg.Definitions(sensors=[build_trino_catch_up(deployment_settings())])
