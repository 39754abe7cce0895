"""The tables' maintenance as a Dagster job and its schedule, outside the nightly window.

Once a day (KIMI_BATCH_MAINTENANCE_CRON, default midday in KIMI_BATCH_TIMEZONE) `maintenance_job`
expires every table's snapshots older than KIMI_BATCH_SNAPSHOT_RETENTION_DAYS (tagged and
current ones kept) and removes the files nothing names any more (`warehouse.maintenance`). A
night still running at that hour (a late start, a long catch-up) makes the tick skip: the
night's commits and the expiry would race on the same tables' metadata, and the next day's tick
does it. The schedule starts as the nightly one does (KIMI_BATCH_NIGHTLY_STATUS): an instance
that loads this location runs nothing by itself.
"""

from datetime import timedelta

import dagster as dg

from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import JOB_TAG, NIGHTLY_JOB_NAME
from kimi_batch.defs.resources import WarehouseResource
from kimi_batch.settings import Settings
from kimi_batch.warehouse import maintain

MAINTENANCE_JOB_NAME = "maintenance_job"
_ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


@dg.op(description="Expire old snapshots and remove unreferenced files of every output table.")
def maintain_tables(context: dg.OpExecutionContext, warehouse: WarehouseResource) -> None:
    settings = warehouse.deployment
    reports = maintain(
        warehouse.warehouse(), retention=timedelta(days=settings.snapshot_retention_days)
    )
    for report in reports:
        context.log.info(f"{report.table}: {report.model_dump_json()}")
    context.add_output_metadata(
        {
            "snapshots_expired": sum(r.snapshots_expired for r in reports),
            "files_removed": sum(r.files_removed for r in reports),
            "bytes_removed": sum(r.bytes_removed for r in reports),
            "metadata_bytes_max": max((r.metadata_bytes for r in reports), default=0),
        }
    )


@dg.job(
    name=MAINTENANCE_JOB_NAME,
    description="The output tables' snapshot expiry and orphan-file removal (no model server).",
    tags={JOB_TAG: "maintenance"},
)
def maintenance_job() -> None:
    maintain_tables()


def build_maintenance_schedule(settings: Settings) -> dg.ScheduleDefinition:
    """The daily maintenance of the deployment `settings` (cron, timezone, status)."""

    @dg.schedule(
        name="table_maintenance_schedule",
        job=maintenance_job,
        cron_schedule=settings.maintenance_cron,
        execution_timezone=settings.timezone,
        default_status=(
            dg.DefaultScheduleStatus.RUNNING
            if settings.nightly_running
            else dg.DefaultScheduleStatus.STOPPED
        ),
        description=(
            "Daily table maintenance outside the nightly window: snapshots older than "
            f"{settings.snapshot_retention_days} days expire (tagged ones stay), unreferenced "
            f"files go. Cron '{settings.maintenance_cron}', timezone {settings.timezone}."
        ),
    )
    def table_maintenance_schedule(
        context: dg.ScheduleEvaluationContext,
    ) -> dg.RunRequest | dg.SkipReason:
        running = context.instance.get_run_records(
            dg.RunsFilter(job_name=NIGHTLY_JOB_NAME, statuses=_ACTIVE), limit=1
        )
        if running:
            return dg.SkipReason("a night is still running: its commits come first")
        day = context.scheduled_execution_time.date().isoformat()
        return dg.RunRequest(run_key=f"maintenance:{day}")

    return table_maintenance_schedule


@dg.definitions
def defs() -> dg.Definitions:
    """The maintenance job and its schedule."""
    settings = deployment_settings()
    return dg.Definitions(jobs=[maintenance_job], schedules=[build_maintenance_schedule(settings)])
