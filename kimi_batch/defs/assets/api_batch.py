"""`api_batch_responses`: one Batch API batch answered by the resident server, one partition each.

The batch's requests are grouped by their system prompt; each group runs with that prompt as its
digest (prefilled once, saved, restored into every slot) and everything else as submitted. The
rows land in the `distilled` table at ds=<day created>/source=<batch id>, the output and error
files in the API's file store, through `land_stage` as every stage's rows. Cancelling the batch
(the API) or terminating the run (the UI) cancels the requests in flight, which closes their
connections: llama-server stops those slots; the batch ends `cancelled` and the run CANCELED.
"""

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NoReturn

import dagster as dg

from kimi_batch.defs.assets.checks import check_specs
from kimi_batch.defs.assets.context import LLAMA_POOL
from kimi_batch.defs.assets.landing import StagePlan, land_stage
from kimi_batch.defs.assets.lease import HeldPartition, partition_lease
from kimi_batch.defs.interrupts import run_interruptibly
from kimi_batch.defs.partitions import api_batch_partitions
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine import (
    BatchEngine,
    BatchOutcome,
    GenerationRequest,
    Ledger,
    SystemDigest,
)
from kimi_batch.settings import Settings
from kimi_batch.storage import (
    ApiStore,
    BatchRecord,
    BatchStatus,
    StorageError,
    Warehouse,
    batch_lines,
    begin_batch,
    finish_batch,
)
from kimi_batch.tasks.api_batch import ApiBatchInputs, ApiBatchTask
from kimi_batch.tasks.openai_batch import BatchLineError

__all__ = [
    "API_GROUP",
    "API_TRIGGER_TAG",
    "api_batch_responses",
    "finish_abandoned_batch",
]

API_GROUP = "api"
# Set by the API batch sensor on the first run of a batch; a rerun by hand has no such tag.
API_TRIGGER_TAG = "kimi_batch/api_batch"
CANCEL_POLL_S = 0.25


async def _until_done_or_cancelled(
    task: asyncio.Task[BatchOutcome], store: ApiStore, batch_id: str
) -> BatchOutcome | None:
    """The group's outcome, or None when the batch was cancelled (its requests then stop)."""
    while True:
        done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_S)
        if done:
            return task.result()
        record = store.batch(batch_id)
        if record is not None and record.status == BatchStatus.CANCELLING:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return None


async def _answer(
    context: dg.AssetExecutionContext,
    llama: LlamaServerResource,
    store: ApiStore,
    ledger: Ledger,
    batch: BatchRecord,
    groups: dict[str, list[GenerationRequest]],
) -> tuple[list[BatchOutcome], bool]:
    """Each system-prompt group on every slot; (outcomes, cancelled)."""
    stop_at = datetime.fromtimestamp(batch.expires_at, UTC)
    outcomes: list[BatchOutcome] = []
    for system, requests in groups.items():
        digest = SystemDigest.from_text(system, path=f"{batch.id} system prompt")
        prepared = await llama.prepare(digest)
        engine = BatchEngine(
            prepared.endpoints,
            digest,
            ledger,
            digest_tokens=prepared.digest_tokens,
            on_progress=lambda event: context.log.info(str(event)),
            on_unreachable=llama.respawn_if_down,
            on_hung=llama.restart_hung,
            speed_store=llama.speed_store(),
        )
        store.set_request_keys(
            batch.id, [(p.request.input_id, p.content_key) for p in engine.plan(requests)]
        )
        task = asyncio.create_task(engine.run(requests, stop_at=stop_at))
        outcome = await _until_done_or_cancelled(task, store, batch.id)
        if outcome is None:
            return outcomes, True
        outcomes.append(outcome)
        if outcome.stopped_at_window:
            break
    return outcomes, False


def _merged(outcomes: Sequence[BatchOutcome]) -> BatchOutcome:
    """One outcome for the batch's groups: rows and failures of all, counts summed, the
    cache-hit figure the worst group's."""
    main = max(outcomes, key=lambda o: o.stats.total)
    stats = main.stats.model_copy(
        update={
            field: sum(getattr(o.stats, field) for o in outcomes)
            for field in (
                "total",
                "generated",
                "from_ledger",
                "failed",
                "not_started",
                "truncated",
                "empty",
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "digest_reprefills",
            )
        }
        | {"cache_hit_ratio": min(o.stats.cache_hit_ratio for o in outcomes)}
    )
    return main.model_copy(
        update={
            "planned": [row for o in outcomes for row in o.planned],
            "failures": [failure for o in outcomes for failure in o.failures],
            "stats": stats,
            "stopped_at_window": any(o.stopped_at_window for o in outcomes),
        }
    )


def finish_abandoned_batch(
    settings: Settings, store: ApiStore, batch: BatchRecord, run: dg.DagsterRun
) -> BatchRecord:
    """Finalize a batch whose run ended without doing it (its processes were killed, run
    monitoring failed it): `cancelled` when a cancel was asked (the API's, or a terminate from
    the UI), else `failed` with an error naming the run; the partial output and error files
    come from the ledger either way."""
    cancel_asked = (
        batch.status == BatchStatus.CANCELLING or run.status == dg.DagsterRunStatus.CANCELED
    )
    status = BatchStatus.CANCELLED if cancel_asked else BatchStatus.FAILED
    if status == BatchStatus.FAILED:
        message = (
            f"the batch's run {run.run_id} ended {run.status.value} before the batch was "
            "finished; its answered requests are in the output file"
        )
        batch = store.update_batch(
            batch.id, errors=[*batch.errors, BatchLineError(code="run_failed", message=message)]
        )
    try:
        lines = batch_lines(settings, batch)
    except StorageError:
        # The landed input is gone or unreadable: the final status without files.
        return store.update_batch(batch.id, status=status)
    with Ledger(settings.paths.ledger_state) as ledger:
        return finish_batch(store, ledger, batch.id, lines, status)


def _cancelled_message(done: BatchRecord) -> str:
    answered = done.request_total - done.request_failed
    return (
        f"{done.id} was cancelled: {answered} of {done.request_total} requests answered "
        "(kept; a rerun sends the rest)"
    )


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
    message = _cancelled_message(done)
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
    llama: LlamaServerResource,
    store: ApiStore,
    held: HeldPartition,
    plan: StagePlan,
    batch: BatchRecord,
    *,
    warehouse: Warehouse,
    trino: TrinoResource,
) -> dg.MaterializeResult | BatchRecord:
    """Run the taken-up batch and land it: the materialization, or the batch's final record
    when a cancel stopped it first (the partial output and error files written)."""
    inputs: ApiBatchInputs = plan.inputs
    ledger, lines, groups = held.ledger, inputs.lines, inputs.groups()
    try:
        outcomes, cancelled = run_interruptibly(
            _answer(context, llama, store, ledger, batch, groups)
        )
    except dg.DagsterExecutionInterruptedError:
        # A run terminated from the UI lands here, its requests cancelled by now.
        finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
        raise
    except Exception:
        finish_batch(store, ledger, batch.id, lines, BatchStatus.FAILED)
        raise
    if cancelled or not outcomes:
        return finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
    outcome = _merged(outcomes)
    landed = land_stage(
        context, plan, held, outcome, outcome.iter_results(ledger), store=warehouse, trino=trino
    )
    # Completed once its rows are in the table (and Trino): then the files, then the status.
    status = BatchStatus.EXPIRED if outcome.stopped_at_window else BatchStatus.COMPLETED
    done = finish_batch(store, ledger, batch.id, lines, status, outcomes=outcomes)
    metadata = {
        **(landed.metadata or {}),
        "batch_id": dg.MetadataValue.text(batch.id),
        "system_prompts": len(groups),
        "batch_status": dg.MetadataValue.text(done.status.value),
    }
    return dg.MaterializeResult(metadata=metadata, check_results=landed.check_results)


@dg.asset(
    partitions_def=api_batch_partitions,
    group_name=API_GROUP,
    pool=LLAMA_POOL,
    kinds={"parquet", "trino"},
    check_specs=check_specs("api_batch_responses", api_batch_partitions),
)
def api_batch_responses(
    context: dg.AssetExecutionContext,
    llama: LlamaServerResource,
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
        plan = _plan(task, batch.ds, batch.source, batch.input_sha256)
        with partition_lease(context, warehouse, plan.ds, plan.source) as held:
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
                answered = _answered(
                    context,
                    llama,
                    store,
                    held,
                    plan,
                    started,
                    warehouse=warehouse.warehouse(),
                    trino=trino,
                )
    if isinstance(answered, BatchRecord):  # cancelled: the lease and the store are let go
        _end_run_cancelled(context, answered)
    return answered


def _plan(task: ApiBatchTask, ds: str, source: str, input_sha: str | None) -> StagePlan:
    """The batch as a stage's partition: its lines, landed at ds/source from input `input_sha`."""
    inputs = task.load(lambda table, model: [])  # the lines are the inputs: no table read
    return StagePlan(
        task=task,
        ds=ds,
        source=source,
        inputs=inputs,
        requests=task.requests(inputs),
        input_sha=input_sha or "",
    )
