"""The inbox sensor: a new or changed input file starts `ingest_job` for its partition.

What a tick asks for, and under which run key, is `kimi_batch.inputs.plan_inbox_tick` (see
`inputs/inbox_tick.py`); here it runs on the sensor's cursor and instance, and its requests
become Dagster run requests with the file's source partition added.

The sensor starts STOPPED unless `KIMI_BATCH_INBOX_SENSOR_STATUS=running`: a sensor that starts
by itself would launch runs for whatever lies in the inbox in every instance that loads this code
location, test instances included, and compete with the runs a test or a user starts.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import RETRY_TAGS, ingest_job
from kimi_batch.defs.partitions import (
    DATE_DIMENSION,
    SOURCE_DIMENSION,
    build_date_partitions,
    source_partitions,
)
from kimi_batch.inputs import HASH_BUDGET_S as TICK_HASH_BUDGET_S
from kimi_batch.inputs import LAND_BUDGET_S as TICK_LAND_BUDGET_S
from kimi_batch.inputs import SETTLE_S as LANDING_SETTLE_S
from kimi_batch.inputs import (
    InboxCursor,
    InboxRequest,
    IngestRun,
    Landing,
    land_for_any_host,
    landed_state,
    landing_retries,
    plan_inbox_tick,
    scan_inbox,
)
from kimi_batch.settings import Settings

FILE_TAG = "kimi_batch/inbox_file"
SHA256_TAG = "kimi_batch/sha256"
# Module globals read per tick, not default arguments, so tests can shorten them: a file
# modified this recently may still be being written (landing applies the same check to every
# run); hashing, and landing with the state shared by hosts, stop after their budgets.
SETTLE_S = LANDING_SETTLE_S
HASH_BUDGET_S = TICK_HASH_BUDGET_S
LAND_BUDGET_S = TICK_LAND_BUDGET_S
_RECENT_RUNS = 500
_IN_FLIGHT = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
)


def run_request(request: InboxRequest) -> dg.RunRequest:
    """The ingest run of one inbox request, in the file's (date, source) partition."""
    return dg.RunRequest(
        run_key=request.run_key,
        partition_key=dg.MultiPartitionKey(
            {DATE_DIMENSION: request.assignment.ds, SOURCE_DIMENSION: request.assignment.source}
        ),
        tags={
            FILE_TAG: request.file.name,
            SHA256_TAG: request.file.sha256 or "unread",
            **RETRY_TAGS,
        },
    )


def _ingest_runs(instance: dg.DagsterInstance) -> dict[tuple[str, str], list[IngestRun]]:
    """The recent ingest runs by (inbox file, sha256), newest first: one query a tick, not one
    per file, so a tick over thousands of files stays cheap."""
    runs_of: dict[tuple[str, str], list[IngestRun]] = {}
    for run in instance.get_runs(
        filters=dg.RunsFilter(job_name=ingest_job.name), limit=_RECENT_RUNS
    ):
        key = (run.tags.get(FILE_TAG, ""), run.tags.get(SHA256_TAG, ""))
        runs_of.setdefault(key, []).append(
            IngestRun(run_id=run.run_id, in_flight=run.status in _IN_FLIGHT)
        )
    return runs_of


def _new_sources(instance: dg.DagsterInstance, requests: Sequence[InboxRequest]) -> list[str]:
    wanted = {request.assignment.source for request in requests}
    if not wanted:
        return []
    existing = set(instance.get_dynamic_partitions(source_partitions.name or "source"))
    return sorted(wanted - existing)


def _tick(context: dg.SensorEvaluationContext, settings: Settings) -> dg.SensorResult:
    inbox_dir = settings.paths.inbox_dir
    start = settings.first_partition_date()
    with Landing(settings.paths) as landing:
        files = scan_inbox(inbox_dir)
        plan = plan_inbox_tick(
            files,
            InboxCursor.parse(context.cursor),
            assign=lambda item: landing.assign_file(item, arrived=settings.today(), start=start),
            is_valid_ds=build_date_partitions(settings).has_partition_key,
            max_input_bytes=settings.max_input_bytes,
            earlier_landings=lambda item, sha256: landing.earlier_landings(
                item.ds, item.source, sha256
            ),
            landed=lambda item: landed_state(landing, item),
            settle_s=SETTLE_S,
            hash_budget_s=HASH_BUDGET_S,
        )
        retries = landing_retries(landing, files, plan, _ingest_runs(context.instance))
        for retry in retries:
            context.log.warning(f"{retry.file.name}: its last run did not land it; asking again")
        plan = plan.model_copy(update={"requests": [*plan.requests, *retries]})
        if settings.paths.database_url is not None:
            plan = land_for_any_host(
                landing,
                plan,
                InboxCursor.parse(context.cursor),
                max_input_bytes=settings.max_input_bytes,
                budget_s=LAND_BUDGET_S,
            )
    for warning in plan.warnings:
        context.log.warning(warning)
    new_sources = _new_sources(context.instance, plan.requests)
    if not plan.requests:
        return dg.SensorResult(
            skip_reason=dg.SkipReason(
                f"no new or changed files in {inbox_dir} "
                f"({plan.unchanged} unchanged, {plan.built} already built, "
                f"{plan.deferred} deferred)"
            ),
            cursor=plan.cursor.dump(),
        )
    context.log.info(
        f"requesting {len(plan.requests)} run(s); new sources: {', '.join(new_sources) or 'none'}"
    )
    return dg.SensorResult(
        run_requests=[run_request(request) for request in plan.requests],
        dynamic_partitions_requests=(
            [source_partitions.build_add_request(new_sources)] if new_sources else []
        ),
        cursor=plan.cursor.dump(),
    )


def build_inbox_sensor(settings: Settings) -> dg.SensorDefinition:
    """The inbox sensor of the deployment `settings` (its inbox, interval and default status)."""

    @dg.sensor(
        name="inbox_sensor",
        job=ingest_job,
        minimum_interval_seconds=settings.inbox_sensor_interval_s,
        default_status=(
            dg.DefaultSensorStatus.RUNNING
            if settings.inbox_sensor_running
            else dg.DefaultSensorStatus.STOPPED
        ),
        description=(
            "Watches $KIMI_BATCH_HOME/inbox: a new or changed input file adds its source "
            "partition and starts ingest_job for (date, source). Run key = file path + content "
            "hash (+ how often that content was landed before), so an unchanged file never runs "
            "twice and a file changed back to an earlier content runs again; a content already "
            "landed and built (by the night) starts no run. Unreadable and "
            "refused files are "
            "requested for quarantine without being read. With the state in PostgreSQL it "
            "lands each file it reads first, so the runs on any host read the snapshot."
        ),
    )
    def inbox_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        """Request ingestion for new or changed inbox files."""
        if not settings.paths.inbox_dir.is_dir():
            return dg.SensorResult(
                skip_reason=dg.SkipReason(f"inbox {settings.paths.inbox_dir} does not exist yet"),
                cursor=context.cursor,
            )
        return _tick(context, settings)

    return inbox_sensor


@dg.definitions
def defs() -> dg.Definitions:
    """The inbox sensor of this code location."""
    return dg.Definitions(sensors=[build_inbox_sensor(deployment_settings())])
