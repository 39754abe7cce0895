"""The API batch sensor: a batch created through `kimi-batch api` becomes a run at once.

Each tick lists the validated batches still waiting for a run, adds each one's `api_batch`
partition and requests `api_batch_job` for it under the run key `api:<batch id>`: the daemon
never starts a second run for a key it has seen, so a batch runs once by itself (a rerun is a
materialization by hand, which sends only what the ledger lacks). A batch cancelled before its
run started gets its run too (the same key): the run sees the cancel and finishes it at once.

With no daemon serving the instance, `kimi-batch api` does this same work itself
(`kimi_batch/batch_api/web/runs.py`) through `batches_needing_runs`, the one place that decides which batch
needs a run; a batch with a run already requested by either is never asked for again.

Unlike the inbox sensor it starts RUNNING: it acts only on batches someone created through the
API in this state dir, and a batch that waits for someone to switch a sensor on is a bug to the
client polling it. KIMI_BATCH_API_SENSOR_INTERVAL (seconds, default 2) is its tick.

Each tick first takes up what a killed process left behind (`resume_abandoned`): a batch whose
validation was abandoned (the API process died while or before validating it) is validated again
here, and one cancelled before it was landed ends `cancelled`, so no batch stays `validating` or
`cancelling` for want of a process.

Each tick also finalizes the batches whose run ended without finishing them (the run worker was
killed, run monitoring failed the run): a batch whose run is FAILURE or CANCELED in the instance
while the batch is not final would say `in_progress` forever. It becomes `failed` (an error
names the run) or `cancelled` (a cancel was asked), with its partial output and error files.
"""

from __future__ import annotations

from typing import Protocol

import dagster as dg

from kimi_batch.batch_api import (
    ApiStore,
    BatchRecord,
    BatchStatus,
    resume_abandoned,
    validate_batch,
)
from kimi_batch.defs.assets.api_batch import API_TRIGGER_TAG, finish_abandoned_batch
from kimi_batch.defs.deployment import deployment_settings
from kimi_batch.defs.jobs import api_batch_job
from kimi_batch.defs.partitions import api_batch_partitions
from kimi_batch.settings import Settings

# Statuses a batch holds while a run is (or should be) working on it.
_UNFINISHED = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)
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


def _finish_abandoned(
    instance: dg.DagsterInstance, log: _Log, settings: Settings, store: ApiStore
) -> None:
    """Finalize each unfinished batch whose run has ended (see the module)."""
    for status in _UNFINISHED:
        for batch in store.batches(status=status):
            run = run_of(instance, batch)
            if run is None or run.status not in _RUN_ENDED:
                continue
            if run.tags.get(_WILL_RETRY_TAG) == "true":
                continue  # its retry takes the batch up again
            done = finish_abandoned_batch(settings, store, batch, run)
            log.warning(
                f"{batch.id}: its run {run.run_id} ended {run.status.value} with the batch "
                f"{batch.status.value}; the batch is now {done.status.value}"
            )


def batches_needing_runs(
    settings: Settings, instance: dg.DagsterInstance, log: _Log
) -> list[BatchRecord]:
    """The one place that decides which batch needs a run, for the sensor and for `kimi-batch
    api`'s own launcher alike: what a killed process left is taken up, batches whose run ended are
    finalized, and the validated (or cancelled) batches with no run yet are returned."""
    if not ApiStore.exists(settings.paths):
        return []
    with ApiStore(settings.paths) as store:
        resumed = resume_abandoned(
            settings, store, validate=lambda batch: validate_batch(settings, store, batch)
        )
        for batch_id in resumed:
            log.warning(
                f"{batch_id}: the process validating it stopped; validated again or finished here"
            )
        _finish_abandoned(instance, log, settings, store)
        # A batch with a run requested (queued, or launched by the other launcher) has its run:
        # whichever of the daemon and the API asks first, the other never asks again.
        return [
            batch
            for status in (BatchStatus.VALIDATING, BatchStatus.CANCELLING)
            for batch in store.batches(status=status)
            if batch.input_sha256 is not None
            and batch.run_id is None
            and run_of(instance, batch) is None
        ]


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
