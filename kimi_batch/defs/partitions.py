"""Batch partitions: one per (arrival date, source file).

The date dimension is the day the input arrived (in KIMI_BATCH_TIMEZONE, the nightly schedule's
clock), so the nightly schedule can ask for exactly that day's batches and backfills work over
date ranges; the source dimension is dynamic because inbox files are discovered at run time (the
sensor adds them). The dates start at KIMI_BATCH_PARTITIONS_START, by default the day this state
dir was first used, so a new install shows no year of empty partitions; an input dated earlier
lands on the first day instead of being dropped (`kimi_batch.storage.landing`).
"""

from __future__ import annotations

import dagster as dg

from kimi_batch.settings import Settings

__all__ = [
    "API_BATCH_PARTITIONS_NAME",
    "DATE_DIMENSION",
    "SOURCE_DIMENSION",
    "SOURCE_PARTITIONS_NAME",
    "api_batch_partitions",
    "batch_partitions",
    "date_partitions",
    "partition_parts",
    "source_partitions",
]

DATE_DIMENSION = "date"
SOURCE_DIMENSION = "source"
SOURCE_PARTITIONS_NAME = "source"
API_BATCH_PARTITIONS_NAME = "api_batch"

_SETTINGS = Settings.from_env()
date_partitions = dg.DailyPartitionsDefinition(
    start_date=_SETTINGS.first_partition_date().isoformat(),
    end_offset=1,
    timezone=_SETTINGS.timezone,
)
source_partitions = dg.DynamicPartitionsDefinition(name=SOURCE_PARTITIONS_NAME)
batch_partitions = dg.MultiPartitionsDefinition(
    {DATE_DIMENSION: date_partitions, SOURCE_DIMENSION: source_partitions}
)

# One partition per Batch API batch (its id), added by the API batch sensor when the batch is
# created; its rows land in the tables at ds=<day created>/source=<batch id>.
api_batch_partitions = dg.DynamicPartitionsDefinition(name=API_BATCH_PARTITIONS_NAME)


def partition_parts(context: dg.AssetExecutionContext) -> tuple[str, str]:
    """(ds, source) of the partition being materialized."""
    key = context.partition_key
    if not isinstance(key, dg.MultiPartitionKey):
        raise dg.Failure(f"expected a date|source partition key, got {key!r}")
    dims = key.keys_by_dimension
    return dims[DATE_DIMENSION], dims[SOURCE_DIMENSION]
