"""Night-built partitions get their data versions from their own asset runs: when a
`nightly_job` run ends (succeeded, failed, terminated), these sensors ask one
`partition_versions_job` run per partition it materialized, over the assets the night
materialized there, with the night's stage configs and window; the assets rebuild it from the
ledger (docs/architecture.md, "Data flow", explains why an op cannot version them). A request
the night failed is sent again (inside the night's window), as any rebuild would.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import dagster as dg

from kimi_batch.defs.assets.night import nightly_job
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import (
    BATCH_GROUP,
    JOB_TAG,
    LLAMA_TAG,
    NIGHT_RUN_TAG,
    NIGHTLY_OP_NAME,
    WINDOW_TAG,
)
from kimi_batch.pipeline import SEED_ASSET, STAGE_DECLARATIONS
from kimi_batch.settings import Settings

PARTITION_VERSIONS_JOB = "partition_versions_job"
_PAGE = 1000
# How a night ends with partitions it materialized: done, failed naming some, or terminated.
_NIGHT_ENDS = (
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
)

partition_versions_job = dg.define_asset_job(
    name=PARTITION_VERSIONS_JOB,
    selection=dg.AssetSelection.groups(BATCH_GROUP),
    description="One partition the night built, rebuilt from the ledger by its assets' own "
    "code, so its materializations carry their data versions (asked by the night_versions "
    "sensors; any subset of the batch assets).",
    tags={JOB_TAG: "versions", LLAMA_TAG: "true"},
)


def night_built(instance: dg.DagsterInstance, run_id: str) -> dict[str, list[str]]:
    """The assets (names) each partition key had materialized by the run `run_id`."""
    built: dict[str, set[str]] = defaultdict(set)
    cursor: str | None = None
    while True:
        page = instance.get_records_for_run(
            run_id, cursor=cursor, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, limit=_PAGE
        )
        for record in page.records:
            event = record.event_log_entry.asset_materialization
            if event is not None and event.partition is not None:
                built[event.partition].add(event.asset_key.to_user_string())
        if not page.has_more:
            break
        cursor = page.cursor
    return {key: sorted(assets) for key, assets in built.items()}


def _stage_configs(night: Mapping[str, Any], assets: list[str]) -> dict[str, Any]:
    """Each selected asset's run config, from the night's: the same requests, ledger hits."""
    ops: dict[str, Any] = {}
    if SEED_ASSET in assets and "seeds" in night:
        ops[SEED_ASSET] = {"config": night["seeds"]}
    for declaration in STAGE_DECLARATIONS.values():
        field = declaration.config_field
        if declaration.asset in assets and declaration.config is not None and field in night:
            ops[declaration.asset] = {"config": night[field]}
    return {"ops": ops}


def version_requests(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[dg.RunRequest]:
    """One `partition_versions_job` run request per partition the night run materialized."""
    ops: Any = (run.run_config or {}).get("ops", {})
    night: Mapping[str, Any] = ops.get(NIGHTLY_OP_NAME, {}).get("config", {})
    tags = {NIGHT_RUN_TAG: run.run_id}
    if WINDOW_TAG in run.tags:  # past the night's window, no request is sent (failed ones stay)
        tags[WINDOW_TAG] = run.tags[WINDOW_TAG]
    return [
        dg.RunRequest(
            run_key=f"{run.run_id}|{key}",
            job_name=PARTITION_VERSIONS_JOB,
            partition_key=key,
            asset_selection=[dg.AssetKey(asset) for asset in assets],
            run_config=_stage_configs(night, assets),
            tags=tags,
        )
        for key, assets in sorted(night_built(instance, run.run_id).items())
    ]


def build_night_versions(settings: Settings) -> list[dg.RunStatusSensorDefinition]:
    """The sensors asking for the version runs after a night that succeeded, failed or was
    terminated; running when the nightly schedule is."""
    status = (
        dg.DefaultSensorStatus.RUNNING
        if settings.nightly_running
        else dg.DefaultSensorStatus.STOPPED
    )

    def build(run_status: dg.DagsterRunStatus) -> dg.RunStatusSensorDefinition:
        @dg.run_status_sensor(
            run_status=run_status,
            name=f"night_versions_on_{run_status.value.lower()}",
            monitored_jobs=[nightly_job],
            request_job=partition_versions_job,
            default_status=status,
            description="After a nightly_job run: one partition_versions_job run per partition "
            "it materialized (ledger hits), so its materializations carry data versions.",
        )
        def night_versions(context: dg.RunStatusSensorContext) -> list[dg.RunRequest]:
            return version_requests(context.instance, context.dagster_run)

        return night_versions

    return [build(status) for status in _NIGHT_ENDS]


@dg.definitions
def defs() -> dg.Definitions:
    """The version runs' job and sensors of this code location."""
    return dg.Definitions(
        jobs=[partition_versions_job], sensors=build_night_versions(deployment_settings())
    )
