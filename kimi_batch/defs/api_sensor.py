"""The API batch sensor: a batch created through `kimi-batch api` becomes a run at once.

Each tick takes the batches `kimi_batch.batch_api.batches_to_run` picks (the one place that
decides which batch needs a run, for this sensor and `kimi-batch api`'s own launcher, which
calls `batches_needing_runs` here), adds each one's `api_batch` partition and requests
`api_batch_job` for it under the run key `api:<batch id>`: the daemon never starts a second run
for a key it has seen, so a batch runs once by itself (a rerun is a materialization by hand,
which sends only what the ledger lacks). A batch cancelled before its run started gets its run
too (the same key): the run sees the cancel and finishes it at once. The run answering a batch
is found here, in the instance (`run_of`).

Unlike the inbox sensor it starts RUNNING: it acts only on batches someone created through the
API in this state dir, and a batch that waits for someone to switch a sensor on is a bug to the
client polling it. KIMI_BATCH_API_SENSOR_INTERVAL (seconds, default 2) is its tick.
"""

from __future__ import annotations

from typing import Protocol

import dagster as dg

from kimi_batch.batch_api import (
    ApiStore,
    BatchRecord,
    BatchRunState,
    batches_to_run,
)
from kimi_batch.batch_api import finish_abandoned_batch as finish_ended_batch
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import api_batch_job
from kimi_batch.defs.partitions import api_batch_partitions
from kimi_batch.settings import Settings

_RUN_ENDED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
# Set by Dagster on a failed run that run retries will execute again (dagster/max_retries).
_WILL_RETRY_TAG = "dagster/will_retry"


class _Log(Protocol):
    """Where a warning goes: the sensor's log, or the API process's logger."""

    def warning(self, msg: str) -> None: ...


def run_of(instance: dg.DagsterInstance, batch: BatchRecord) -> dg.DagsterRun | None:
    """The run answering the batch: the one that took it up, else the newest requested for it."""
    if batch.run_id is not None:
        return instance.get_run_by_id(batch.run_id)
    runs = instance.get_runs(filters=dg.RunsFilter(tags={API_TRIGGER_TAG: batch.id}), limit=1)
    return runs[0] if runs else None


def run_state(run: dg.DagsterRun) -> BatchRunState:
    """What the batch's bookkeeping needs of its Dagster run."""
    return BatchRunState(
        run_id=run.run_id,
        status=run.status.value,
        ended=run.status in _RUN_ENDED,
        cancelled=run.status == dg.DagsterRunStatus.CANCELED,
        will_retry=run.tags.get(_WILL_RETRY_TAG) == "true",
    )


def finish_abandoned_batch(
    settings: Settings, store: ApiStore, batch: BatchRecord, run: dg.DagsterRun
) -> BatchRecord:
    """`batch_api.finish_abandoned_batch` of a batch whose Dagster `run` ended."""
    return finish_ended_batch(settings, store, batch, run_state(run))


def batches_needing_runs(
    settings: Settings, instance: dg.DagsterInstance, log: _Log
) -> list[BatchRecord]:
    """`batch_api.batches_to_run`, each batch's run looked up in `instance`."""

    def state_of(batch: BatchRecord) -> BatchRunState | None:
        run = run_of(instance, batch)
        return None if run is None else run_state(run)

    return batches_to_run(settings, state_of, log)


def missing_batch_partitions(instance: dg.DagsterInstance, batches: list[BatchRecord]) -> list[str]:
    """The `api_batch` partitions of `batches` the instance lacks (to be added with the runs)."""
    known = set(instance.get_dynamic_partitions(api_batch_partitions.name or ""))
    return [batch.id for batch in batches if batch.id not in known]


def build_api_batch_sensor(settings: Settings) -> dg.SensorDefinition:
    """The API batch sensor of the deployment `settings` (its state dir and tick)."""

    @dg.sensor(
        name="api_batch_sensor",
        job=api_batch_job,
        minimum_interval_seconds=settings.api_sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Starts api_batch_job for every batch created through the Batch API (kimi-batch api), "
            "in its own api_batch partition, as soon as it is validated."
        ),
    )
    def api_batch_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        """Request a run for each validated Batch API batch that has none yet."""
        if not ApiStore.exists(settings.paths):
            return dg.SensorResult(skip_reason=dg.SkipReason("no Batch API batches yet"))
        waiting = batches_needing_runs(settings, context.instance, context.log)
        if not waiting:
            return dg.SensorResult(skip_reason=dg.SkipReason("no batch waiting for a run"))
        new = missing_batch_partitions(context.instance, waiting)
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"api:{batch.id}",
                    partition_key=batch.id,
                    tags={API_TRIGGER_TAG: batch.id},
                )
                for batch in waiting
            ],
            dynamic_partitions_requests=[api_batch_partitions.build_add_request(new)]
            if new
            else [],
        )

    return api_batch_sensor


@dg.definitions
def defs() -> dg.Definitions:
    """The API batch sensor of this code location."""
    return dg.Definitions(sensors=[build_api_batch_sensor(deployment_settings())])
