"""Batch partitions: one per (arrival date, source file).

The date dimension is the day the input arrived (in KIMI_BATCH_TIMEZONE, the nightly schedule's
clock), so the nightly schedule can ask for exactly that day's batches and backfills work over
date ranges; the source dimension is dynamic because inbox files are discovered at run time (the
sensor adds them). The dates start at KIMI_BATCH_PARTITIONS_START, by default the day this state
dir was first used, so a new install shows no year of empty partitions; an input dated earlier
lands on the first day instead of being dropped (`kimi_batch.inputs.landing`).

The date dimension depends on the deployment, so it is built from a `Settings` (by the defs
modules, from `kimi_batch.defs.deployment`), never at import: importing this module reads no
variable and writes no install-date file.
"""

from __future__ import annotations

import dagster as dg

from kimi_batch.settings import Settings

DATE_DIMENSION = "date"
SOURCE_DIMENSION = "source"
SOURCE_PARTITIONS_NAME = "source"
API_BATCH_PARTITIONS_NAME = "api_batch"

source_partitions = dg.DynamicPartitionsDefinition(name=SOURCE_PARTITIONS_NAME)


def build_date_partitions(settings: Settings) -> dg.DailyPartitionsDefinition:
    """Arrival dates from the first partition date, in the one clock (KIMI_BATCH_TIMEZONE)."""
    return dg.DailyPartitionsDefinition(
        start_date=settings.first_partition_date().isoformat(),
        end_offset=1,
        timezone=settings.timezone,
    )


def build_batch_partitions(settings: Settings) -> dg.MultiPartitionsDefinition:
    """(date, source): the partitions of every batch asset."""
    return dg.MultiPartitionsDefinition(
        {DATE_DIMENSION: build_date_partitions(settings), SOURCE_DIMENSION: source_partitions}
    )


# One partition per Batch API batch (its id), added by the API batch sensor when the batch is
# created; its rows land in the tables at ds=<day created>/source=<batch id>.
api_batch_partitions = dg.DynamicPartitionsDefinition(name=API_BATCH_PARTITIONS_NAME)
