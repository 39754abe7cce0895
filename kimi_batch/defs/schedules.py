"""The nightly distillation: teacher answers for every partition not yet distilled, oldest first.

"Not yet distilled" includes stale: a partition distilled from an older landed version of its
input than the newest (a producer rewrote the file under the same name) is rebuilt; unchanged
requests come from the ledger, so a new version costs only its new rows.

Each night (KIMI_BATCH_NIGHTLY_CRON, default 02:00, in KIMI_BATCH_TIMEZONE) asks for every
partition of the landing manifest dated up to the day that just ended whose `distilled_responses`
is missing: that day's new inputs, and whatever an earlier night failed or stopped at the window.
So one lost night is recovered the next without anyone touching the UI. Inbox files nobody has
seen yet (the sensor was off) are assigned to the day that just ended first.

The night looks at the inbox itself, sensor or not (it is STOPPED by default): every settled
inbox file is hashed before the night decides, and one whose content is not its partition's
newest landed version is landed as a new version (`storage.land_inbox`), so a file rewritten
under the same name, or reverted (A -> B -> A lands A again), makes its partition stale and
asked for. A file still changing is not waited for: the skip reason (or the log) names it, and
the next tick lands it. The night is one run
of `nightly_job` over all of them (`kimi_batch.defs.assets.night`: one engine run, each
partition's next stage as soon as its last one landed, so the server stays busy across
partitions and stages; each partition still written, materialized and checked on its own), run key `nightly:{night}`: a re-evaluated tick never starts a night twice, and the next
night asks again for whatever this one left.

The nightly window (KIMI_BATCH_NIGHT_ENDS, e.g. `07:00`): the run carries its end as the
`kimi_batch/window_ends` tag; past it no new request is dispatched, those in flight finish, the
partitions done are written and the run fails naming those that resume next night. It also
carries a matching `dagster/max_runtime`, so run monitoring ends a run that overstays anyway.

Starts STOPPED unless KIMI_BATCH_NIGHTLY_STATUS=running: an instance loading this location must
not start runs by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field

from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import NIGHTLY_JOB_NAME, RETRY_TAGS, WINDOW_TAG, nightly_run_config
from kimi_batch.defs.partition_states import distilled_input_sha, night_end_key
from kimi_batch.defs.partitions import (
    DATE_DIMENSION,
    SOURCE_DIMENSION,
    build_date_partitions,
    source_partitions,
    split_partition_key,
)
from kimi_batch.quality import rescreen_partitions
from kimi_batch.settings import Settings
from kimi_batch.storage import SETTLE_S as LANDING_SETTLE_S
from kimi_batch.storage import Assignment, InboxLanding, Landing, land_inbox

TRIGGER_TAG = "kimi_batch/trigger"
NIGHT_TAG = "kimi_batch/night"
# How many partitions the night's run covers (the list is its run config).
PARTITIONS_TAG = "kimi_batch/partitions"
MAX_RUNTIME_TAG = "dagster/max_runtime"
# Requests in flight at the window's end are allowed to finish: on the target one answer after a
# long prompt can take most of an hour.
WINDOW_GRACE_S = 3600
# How long an inbox file must have stood still before the night lands it (a module global read
# per tick, so tests can shorten it); one still changing is landed by the next tick.
SETTLE_S = LANDING_SETTLE_S
_NAMED = 10


class BatchPartition(BaseModel):
    """One (ds, source) batch partition."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ds: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    source: str = Field(min_length=1)

    @property
    def key(self) -> dg.MultiPartitionKey:
        return dg.MultiPartitionKey({DATE_DIMENSION: self.ds, SOURCE_DIMENSION: self.source})


def _local(moment: datetime, settings: Settings) -> datetime:
    zone = settings.zone
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment.astimezone(zone)


def night_ds(scheduled_time: datetime, settings: Settings) -> str:
    """The day that just ended at `scheduled_time` (a naive time is read in the settings' zone)."""
    return (_local(scheduled_time, settings).date() - timedelta(days=1)).isoformat()


def window_end(scheduled_time: datetime, settings: Settings) -> datetime | None:
    """The first KIMI_BATCH_NIGHT_ENDS after `scheduled_time`; None without a window."""
    if settings.night_ends is None:
        return None
    local = _local(scheduled_time, settings)
    end = datetime.combine(local.date(), settings.night_ends, tzinfo=settings.zone)
    return end if end > local else end + timedelta(days=1)


def nightly_partitions(
    assignments: Iterable[Assignment],
    distilled: Iterable[str],
    night: str,
    stale: Iterable[str] = (),
) -> list[BatchPartition]:
    """Partitions dated up to `night` whose distillation is missing or stale, oldest first.

    `distilled` holds the `distilled_responses` partition keys (`ds|source`) materialized;
    `stale` those of them distilled from an older version of their input than the newest landed.
    """
    done: set[tuple[str, str]] = set()
    rebuild = set(stale)
    for raw in (key for key in distilled if key not in rebuild):
        parts = split_partition_key(raw)
        if parts is not None:
            done.add(parts)
    wanted = {
        (item.ds, item.source)
        for item in assignments
        if item.ds <= night and (item.ds, item.source) not in done
    }
    return [BatchPartition(ds=ds, source=source) for ds, source in sorted(wanted)]


def nightly_tags(night: str, end: datetime | None, started: datetime) -> dict[str, str]:
    tags = {TRIGGER_TAG: "nightly", NIGHT_TAG: night, **RETRY_TAGS}
    if end is not None:
        tags[WINDOW_TAG] = end.isoformat()
        tags[MAX_RUNTIME_TAG] = str(int((end - started).total_seconds()) + WINDOW_GRACE_S)
    return tags


def _known_partitions(
    settings: Settings, night: str, accept_ds: Callable[[str], bool]
) -> tuple[list[Assignment], dict[str, str], InboxLanding]:
    """The manifest's partitions, after assigning inbox files nobody has seen to `night` and
    landing every settled file that changed; the sha256 of each one's newest landed version by
    partition key; and what the look at the inbox landed or left for later."""
    with Landing(settings.paths) as landing:
        inbox = land_inbox(
            landing,
            settings.paths.inbox_dir,
            max_bytes=settings.max_input_bytes,
            arrived=date.fromisoformat(night),
            start=settings.first_partition_date(),
            accept_ds=accept_ds,
            settle_s=SETTLE_S,
        )
        assignments = landing.assignments()
        versions = {
            str(BatchPartition(ds=a.ds, source=a.source).key): landing.current(a.ds, a.source)
            for a in assignments
        }
    landed = {key: v.sha256 for key, v in versions.items() if v is not None}
    return assignments, landed, inbox


def _named(names: Sequence[str]) -> str:
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return ", ".join(names[:_NAMED]) + more


def _log_inbox(context: dg.ScheduleEvaluationContext, inbox: InboxLanding) -> str:
    """Log what the look at the inbox did; the sentence naming the files still changing."""
    if inbox.landed:
        context.log.info(
            f"landed {len(inbox.landed)} new input version(s): "
            + _named([f"{v.name} ({v.sha256[:12]})" for v in inbox.landed])
        )
    for problem in inbox.problems:
        context.log.warning(f"inbox file not landed: {problem}")
    if inbox.unread:  # the tick's hashing budget ran out: the next tick reads them
        context.log.info(f"not read yet, looked at by the next tick: {_named(inbox.unread)}")
    if not inbox.settling:
        return ""
    settling = f"still changing, landed by the next tick: {_named(inbox.settling)}"
    context.log.info(settling)
    return settling


def _stale(
    instance: dg.DagsterInstance, distilled: Iterable[str], landed: dict[str, str]
) -> list[str]:
    """Distilled partitions built from another input version than the newest landed one."""
    return [
        key
        for key in distilled
        if key in landed and distilled_input_sha(instance, key) != landed[key]
    ]


def _rescreen(settings: Settings, distilled: Iterable[str]) -> list[str]:
    """Distilled partitions holding repeats of a row that left the duplicate index (its own
    partition rebuilt without it): landed again, their set-aside rows are screened again."""
    done = set(distilled)
    marked = (f"{ds}|{source}" for ds, source in rescreen_partitions(settings.paths.dedup_state))
    return [key for key in marked if key in done]


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
        assignments, landed, inbox = _known_partitions(settings, night, dates.has_partition_key)
        settling = _log_inbox(context, inbox)
        distilled = instance.get_materialized_partitions(night_end_key())
        stale = _stale(instance, distilled, landed)
        stale += [key for key in _rescreen(settings, distilled) if key not in stale]
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
        tags = nightly_tags(night, window_end(scheduled, settings), _local(scheduled, settings))
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
