"""The nightly distillation (docs/concepts/night.md): one `nightly_job` run a night, run key
`nightly:{night}`, over every partition not yet distilled or stale, oldest first (the night's
arithmetic is `pipeline/night.py`), its window's end as the `kimi_batch/window_ends` tag and a
matching `dagster/max_runtime`. Starts STOPPED unless KIMI_BATCH_NIGHTLY_STATUS=running: an
instance loading this location must not start runs by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import dagster as dg

from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, RETRY_TAGS, WINDOW_TAG, nightly_run_config
from kimi_batch.defs.partition_states import distilled_input_sha, night_end_key
from kimi_batch.defs.partitions import build_date_partitions, source_partitions
from kimi_batch.pipeline import (
    WINDOW_GRACE_S,
    BatchPartition,
    known_partitions,
    local_time,
    log_inbox,
    night_ds,
    nightly_partitions,
    rescreen_due,
    window_end,
)
from kimi_batch.settings import Settings

TRIGGER_TAG = "kimi_batch/trigger"
NIGHT_TAG = "kimi_batch/night"
# How many partitions the night's run covers (the list is its run config).
PARTITIONS_TAG = "kimi_batch/partitions"
MAX_RUNTIME_TAG = "dagster/max_runtime"


def nightly_tags(night: str, end: datetime | None, started: datetime) -> dict[str, str]:
    tags = {TRIGGER_TAG: "nightly", NIGHT_TAG: night, **RETRY_TAGS}
    if end is not None:
        tags[WINDOW_TAG] = end.isoformat()
        # In UTC: two times of one zone subtract as wall-clock times, an hour off across a
        # daylight-saving change (the autumn night is 7 h long, not 6).
        window_s = (end.astimezone(UTC) - started.astimezone(UTC)).total_seconds()
        tags[MAX_RUNTIME_TAG] = str(int(window_s) + WINDOW_GRACE_S)
    return tags


def _stale(
    instance: dg.DagsterInstance, distilled: Iterable[str], landed: dict[str, str]
) -> list[str]:
    """Distilled partitions built from another input version than the newest landed one."""
    return [
        key
        for key in distilled
        if key in landed and distilled_input_sha(instance, key) != landed[key]
    ]


def _ensure_sources(instance: dg.DagsterInstance, partitions: Sequence[BatchPartition]) -> None:
    # A schedule cannot return dynamic-partition requests the way a sensor does; add the sources
    # first so the run requests resolve (a file that arrived while the sensor was stopped has no
    # source partition yet).
    name = source_partitions.name or "source"
    existing = set(instance.get_dynamic_partitions(name))
    missing = sorted({item.source for item in partitions} - existing)
    if missing:
        instance.add_dynamic_partitions(name, missing)


def report_idle_night(instance: dg.DagsterInstance, night: str) -> None:
    """Record that `distilled_responses` is current with nothing left to do: an observation whose
    `dagster/last_updated_timestamp` is now. Dagster's freshness check counts it as the night's
    update, so a night with no new input is not reported as a missed one."""
    instance.report_runless_asset_event(
        dg.AssetObservation(
            asset_key=night_end_key(),
            description=f"every partition up to {night} is distilled",
            metadata={
                "night": night,
                "dagster/last_updated_timestamp": dg.MetadataValue.timestamp(datetime.now(UTC)),
            },
        )
    )


def build_nightly_schedule(settings: Settings) -> dg.ScheduleDefinition:
    """The nightly distillation of the deployment `settings` (cron, timezone, window, status)."""

    @dg.schedule(
        name="nightly_distillation_schedule",
        job_name=NIGHTLY_JOB_NAME,
        cron_schedule=settings.nightly_cron,
        execution_timezone=settings.timezone,
        default_status=(
            dg.DefaultScheduleStatus.RUNNING
            if settings.nightly_running
            else dg.DefaultScheduleStatus.STOPPED
        ),
        description=(
            "Nightly teacher run: one nightly_job run over every partition dated up to the day "
            "that just ended whose distillation is missing or stale (built from an older version "
            "of its input; catch-up included), oldest first, stopping at KIMI_BATCH_NIGHT_ENDS. "
            f"Cron '{settings.nightly_cron}', timezone {settings.timezone}."
        ),
    )
    def nightly_distillation_schedule(
        context: dg.ScheduleEvaluationContext,
    ) -> dg.RunRequest | dg.SkipReason:
        """One run distilling every partition missing it or built from an older input."""
        scheduled = context.scheduled_execution_time
        night = night_ds(scheduled, settings)
        dates = build_date_partitions(settings)
        instance = context.instance
        assignments, landed, inbox = known_partitions(settings, night, dates.has_partition_key)
        settling = log_inbox(context.log, inbox)
        distilled = instance.get_materialized_partitions(night_end_key())
        stale = _stale(instance, distilled, landed)
        stale += [key for key in rescreen_due(settings, distilled) if key not in stale]
        partitions = [
            item
            for item in nightly_partitions(assignments, distilled, night, stale)
            if dates.has_partition_key(item.ds)
        ]
        if stale:
            context.log.info(
                f"rebuilding {len(stale)} stale partition(s): {', '.join(sorted(stale)[:10])}"
            )
        if not partitions:
            done = f"every partition up to {night} is distilled"
            report_idle_night(instance, night)
            return dg.SkipReason(f"{done}; {settling}" if settling else done)
        _ensure_sources(instance, partitions)
        tags = nightly_tags(night, window_end(scheduled, settings), local_time(scheduled, settings))
        keys = [str(item.key) for item in partitions]
        return dg.RunRequest(
            run_key=f"nightly:{night}",
            job_name=NIGHTLY_JOB_NAME,
            run_config=nightly_run_config(keys),
            tags={**tags, PARTITIONS_TAG: str(len(keys))},
        )

    return nightly_distillation_schedule


@dg.definitions
def defs() -> dg.Definitions:
    """The nightly schedule of this code location."""
    return dg.Definitions(schedules=[build_nightly_schedule(deployment_settings())])
