"""`api_batch_responses`: one Batch API batch answered by the resident server, one partition
each, through the partition-batch driver as every stage is (docs/architecture.md, "The Batch
API"): its expiry is its stop time; a cancel (the API) or a terminate (the UI) cancels the
requests in flight, the batch ends `cancelled` and the run CANCELED.
"""

from typing import NoReturn

import dagster as dg

from kimi_batch.batch_api import (
    ApiBatchInputs,
    ApiBatchTask,
    ApiStore,
    BatchRecord,
    BatchStatus,
    batch_controls,
    batch_lines,
    begin_batch,
    cancelled_message,
    finish_batch,
)
from kimi_batch.defs.assets.stage_asset import (
    ASSET_OWNERS,
    LLAMA_POOL,
    GenerationResources,
    check_specs,
    run_partitions,
    step_lease,
)
from kimi_batch.defs.partitions import api_batch_partitions
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.engine import Ledger
from kimi_batch.pipeline import (
    BatchCancelledError,
    HeldPartition,
    PartitionResult,
    PipelineStage,
    StagePlan,
)

API_GROUP = "api"
# Set by the API batch sensor on the first run of a batch; a rerun by hand has no such tag.
API_TRIGGER_TAG = "kimi_batch/api_batch"


def _end_run_cancelled(context: dg.AssetExecutionContext, done: BatchRecord) -> NoReturn:
    """End the run of a batch the user cancelled as Dagster's CANCELED, not FAILURE.

    Called once the batch is `cancelled` (its files written) and the partition's lease is
    released. The run is cancelled through the instance's run coordinator, as a terminate from
    the UI is; its status is CANCELING from then on, so it ends CANCELED whether the step's
    error or the termination reaches the run worker first. A canceled run raises no failure
    alert (the run-failure sensor acts on failed runs only) and is not retried. The step's
    error says why it stopped."""
    if done.status != BatchStatus.CANCELLED:  # not cancelled: it had ended before this run
        raise dg.Failure(f"{done.id} is {done.status.value}: this run had nothing to answer")
    message = cancelled_message(done)
    run, instance = context.run, context.instance
    context.log.info(f"{message}; cancelling run {run.run_id}")
    try:
        asked = instance.run_coordinator.cancel_run(run.run_id)
    except Exception as error:  # the code server unreachable: the status below still holds
        context.log.warning(f"the run coordinator did not cancel the run: {error}")
        asked = False
    if not asked:
        # Nothing to terminate (a run in process) or a launcher that cannot: CANCELING is
        # what makes the run's end CANCELED.
        instance.report_run_canceling(run, message=message)
    raise dg.Failure(description=message)


def _answered(
    context: dg.AssetExecutionContext,
    store: ApiStore,
    held: HeldPartition,
    plan: StagePlan,
    batch: BatchRecord,
    resources: GenerationResources,
) -> dg.MaterializeResult | BatchRecord:
    """Run the taken-up batch through the driver and land it: the materialization, or the
    batch's final record when a cancel stopped it first (the partial output and error files
    written)."""
    inputs: ApiBatchInputs = plan.inputs
    ledger, lines = held.ledger, inputs.lines
    try:
        (result,) = run_partitions(
            context,
            [PipelineStage(context.asset_key.to_user_string(), plan.task)],
            {f"{plan.ds}|{plan.source}": held},
            ledger=ledger,
            resources=resources,
            planner=lambda _task, _key: plan,
            controls=batch_controls(store, batch),
        ).values()
    except BatchCancelledError:
        return finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
    except dg.DagsterExecutionInterruptedError:
        # A run terminated from the UI lands here, its requests cancelled by now.
        finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
        raise
    except Exception:
        finish_batch(store, ledger, batch.id, lines, BatchStatus.FAILED)
        raise
    return _finished(context, store, ledger, inputs, batch, result)


def _finished(
    context: dg.AssetExecutionContext,
    store: ApiStore,
    ledger: Ledger,
    inputs: ApiBatchInputs,
    batch: BatchRecord,
    result: PartitionResult[dg.MaterializeResult],
) -> dg.MaterializeResult:
    """The landed batch's files and final status (completed once its rows are in the table
    and Trino; expired when its end came first), then its materialization."""
    if result.materialized is None or result.outcome is None:
        finish_batch(store, ledger, batch.id, inputs.lines, BatchStatus.FAILED)
        raise result.failed or dg.Failure(f"{batch.id} stopped before its end: nothing landed")
    outcome = result.outcome
    status = BatchStatus.EXPIRED if outcome.stopped_at_window else BatchStatus.COMPLETED
    done = finish_batch(store, ledger, batch.id, inputs.lines, status, outcomes=[outcome])
    stats = outcome.stats
    metadata = {
        **(result.materialized.metadata or {}),
        "batch_id": dg.MetadataValue.text(batch.id),
        "system_prompts": len(inputs.system_prompts),
        # Each prompt in a slot once: prefilled and saved for the slots that restore it, or
        # prefilled by its one request; the saves are gone once the batch ends.
        "prompt_warmups": stats.digest_warmups,
        "prompt_restores": stats.digest_restores,
        "one_off_prompt_prefills": stats.own_digest_prefills,
        "slot_saves_peak": stats.slot_saves_peak,
        "batch_status": dg.MetadataValue.text(done.status.value),
    }
    return dg.MaterializeResult(metadata=metadata, check_results=result.materialized.check_results)


@dg.asset(
    partitions_def=api_batch_partitions,
    group_name=API_GROUP,
    pool=LLAMA_POOL,
    kinds={"parquet", "trino"},
    owners=ASSET_OWNERS,
    check_specs=check_specs("api_batch_responses", api_batch_partitions),
)
def api_batch_responses(
    context: dg.AssetExecutionContext,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Answers of one Batch API batch (table `distilled`), each request exactly as submitted.

    A batch the user cancels ends `cancelled` and its run CANCELED (not FAILURE: no alert)."""
    settings = llama.settings()
    with ApiStore(settings.paths) as store:
        batch = store.batch(context.partition_key)
        if batch is None or batch.ds is None or batch.source is None:
            raise dg.Failure(f"no landed Batch API batch {context.partition_key}")
        task = ApiBatchTask(
            batch_id=batch.id, lines=batch_lines(settings, batch), source_file=f"{batch.id}.jsonl"
        )
        plan = task.plan(batch.ds, batch.source, batch.input_sha256)
        resources = GenerationResources(
            llama=llama, digest=digest, warehouse=warehouse, trino=trino
        )
        with step_lease(context, warehouse, plan.ds, plan.source) as held:
            # A compare-and-set: a cancel that landed since the batch was read is not lost.
            started = begin_batch(
                store,
                batch.id,
                run_id=context.run.run_id,
                by_hand=API_TRIGGER_TAG not in context.run.tags,
            )
            if started is None:
                answered = finish_batch(
                    store, held.ledger, batch.id, task.lines, BatchStatus.CANCELLED
                )
            else:
                answered = _answered(context, store, held, plan, started, resources)
    if isinstance(answered, BatchRecord):  # cancelled: the lease and the store are let go
        _end_run_cancelled(context, answered)
    return answered
