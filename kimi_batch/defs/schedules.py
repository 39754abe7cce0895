"""The nightly distillation: at 02:00, teacher answers for every batch of the day that just ended.

"The day's partitions" are the (ds, source) pairs with ds = the scheduled date minus one day (in
the schedule's timezone): every inbox file of that ds, plus every `amplified_prompts` partition
of that ds already materialized (its inbox file may have been cleaned up since). Each is one run
of the partitioned `distillation_job`, so a missed night is caught up with a backfill of the same
job over the date range, and the run key `nightly:{ds}:{source}` keeps a re-evaluated tick from
starting a night twice.

Configuration: `KIMI_BATCH_NIGHTLY_CRON` (default `0 2 * * *`), `KIMI_BATCH_TIMEZONE` (default
`UTC`), `KIMI_BATCH_NIGHTLY_STATUS=running` to start it switched on (default stopped, for the same
reason as the inbox sensor: an instance loading this location must not start runs by itself).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.defs.jobs import distillation_job
from kimi_batch.defs.partitions import (
    DATE_DIMENSION,
    SOURCE_DIMENSION,
    batch_partitions,
    source_partitions,
)
from kimi_batch.defs.sensors import automation_running
from kimi_batch.settings import Settings
from kimi_batch.storage.inbox import inbox_files_for_ds

__all__ = [
    "CRON_ENV",
    "DEFAULT_CRON",
    "DEFAULT_TIMEZONE",
    "NIGHT_TAG",
    "STATUS_ENV",
    "TIMEZONE_ENV",
    "TRIGGER_TAG",
    "BatchPartition",
    "night_ds",
    "nightly_distillation_schedule",
    "nightly_partitions",
]

CRON_ENV = "KIMI_BATCH_NIGHTLY_CRON"
TIMEZONE_ENV = "KIMI_BATCH_TIMEZONE"
STATUS_ENV = "KIMI_BATCH_NIGHTLY_STATUS"
DEFAULT_CRON = "0 2 * * *"
DEFAULT_TIMEZONE = "UTC"
TRIGGER_TAG = "kimi_batch/trigger"
NIGHT_TAG = "kimi_batch/night"
_UPSTREAM = dg.AssetKey("amplified_prompts")


class BatchPartition(BaseModel):
    """One (ds, source) batch partition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str = Field(min_length=1)

    @property
    def key(self) -> dg.MultiPartitionKey:
        return dg.MultiPartitionKey({DATE_DIMENSION: self.ds, SOURCE_DIMENSION: self.source})


def _timezone() -> str:
    name = os.environ.get(TIMEZONE_ENV, "").strip() or DEFAULT_TIMEZONE
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ValueError(f"{TIMEZONE_ENV}={name!r} is not an IANA timezone") from error
    return name


def _cron() -> str:
    return os.environ.get(CRON_ENV, "").strip() or DEFAULT_CRON


def night_ds(scheduled_time: datetime, timezone: str) -> str:
    """The day that just ended at `scheduled_time` (a naive time is read in `timezone`)."""
    zone = ZoneInfo(timezone)
    local = (
        scheduled_time.replace(tzinfo=zone)
        if scheduled_time.tzinfo is None
        else scheduled_time.astimezone(zone)
    )
    return (local.date() - timedelta(days=1)).isoformat()


def nightly_partitions(
    inbox_dir: Path, ds: str, materialized_upstream: Iterable[str] = ()
) -> list[BatchPartition]:
    """The partitions to distill for day `ds`, sorted by source.

    `materialized_upstream` holds `amplified_prompts` partition keys (`ds|source`) already
    materialized; those of day `ds` count even when their file has left the inbox.
    """
    sources = {item.source for item in inbox_files_for_ds(inbox_dir, ds)}
    for raw in materialized_upstream:
        key = batch_partitions.get_partition_key_from_str(raw)
        if isinstance(key, dg.MultiPartitionKey) and key.keys_by_dimension[DATE_DIMENSION] == ds:
            sources.add(key.keys_by_dimension[SOURCE_DIMENSION])
    return [BatchPartition(ds=ds, source=source) for source in sorted(sources)]


_TIMEZONE = _timezone()


@dg.schedule(
    name="nightly_distillation_schedule",
    job=distillation_job,
    cron_schedule=_cron(),
    execution_timezone=_TIMEZONE,
    default_status=(
        dg.DefaultScheduleStatus.RUNNING
        if automation_running(STATUS_ENV)
        else dg.DefaultScheduleStatus.STOPPED
    ),
    description=(
        "Nightly teacher run: distillation_job for every (date, source) partition of the day that "
        "just ended (inbox files of that date plus partitions already amplified). Cron: "
        f"${CRON_ENV} (default '{DEFAULT_CRON}'), timezone: ${TIMEZONE_ENV} (default UTC)."
    ),
)
def nightly_distillation_schedule(
    context: dg.ScheduleEvaluationContext,
) -> list[dg.RunRequest] | dg.SkipReason:
    """Request distillation for the day that just ended."""
    ds = night_ds(context.scheduled_execution_time, _TIMEZONE)
    instance = context.instance
    partitions = nightly_partitions(
        Settings.from_env().inbox_dir, ds, instance.get_materialized_partitions(_UPSTREAM)
    )
    if not partitions:
        return dg.SkipReason(f"nothing arrived on {ds}")
    # A schedule cannot return dynamic-partition requests the way a sensor does; add the sources
    # first so the run requests resolve (a file that arrived while the sensor was stopped has no
    # source partition yet).
    name = source_partitions.name or "source"
    existing = set(instance.get_dynamic_partitions(name))
    missing = sorted({item.source for item in partitions} - existing)
    if missing:
        instance.add_dynamic_partitions(name, missing)
    return [
        dg.RunRequest(
            run_key=f"nightly:{item.ds}:{item.source}",
            partition_key=item.key,
            tags={TRIGGER_TAG: "nightly", NIGHT_TAG: ds},
        )
        for item in partitions
    ]
