"""`api_batch_responses`: one Batch API batch answered by the resident server, one partition each.

The batch's requests are grouped by their system prompt; each group runs with that prompt as its
digest (prefilled once, saved, restored into every slot) and everything else as submitted. The
rows land in the `distilled` table at ds=<day created>/source=<batch id>, the output and error
files in the API's file store. Cancelling the batch (the API) or terminating the run (the UI)
cancels the requests in flight, which closes their connections: llama-server stops those slots.
"""

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import dagster as dg
import polars as pl

from kimi_batch.defs.assets._generation import (
    LLAMA_POOL,
    check_specs,
    generation_checks,
    partition_lease,
    publish,
)
from kimi_batch.defs.assets.landing import stage_metadata
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
    replace_quarantine,
)
from kimi_batch.tasks.api_batch import ApiBatchTask
from kimi_batch.tasks.openai_batch import BatchLineError
from kimi_batch.tasks.sink import StageSink

__all__ = ["API_GROUP", "API_TRIGGER_TAG", "api_batch_responses", "finish_abandoned_batch"]

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
    with Ledger(settings.paths.ledger_path) as ledger:
        return finish_batch(store, ledger, batch.id, lines, status)


def _land(
    context: dg.AssetExecutionContext,
    task: ApiBatchTask,
    outcome: BatchOutcome,
    ledger: Ledger,
    *,
    warehouse: Warehouse,
    trino: TrinoResource,
    ds: str,
    source: str,
    guard: Callable[[], None],
) -> "tuple[list[dg.AssetCheckResult], dict[str, dg.RawMetadataValue]]":
    """The batch's final answers into its `distilled` partition, the rest into quarantine;
    `guard` (the partition lease's check) runs before each write."""
    sink = StageSink(task, task.load(lambda table, model: []))
    written = warehouse.write_partition(
        task.table, ds, source, sink.rows(outcome.iter_results(ledger)), guard=guard
    )
    sink.failed(
        outcome.failures,
        source_file=task.source_file,
        model=outcome.model,
        digest_sha=outcome.digest_sha256,
        created_at=datetime.now(UTC),
    )
    quarantined = replace_quarantine(
        warehouse, ds, source, task.name, sink.quarantined, guard=guard
    )
    checks = generation_checks(task.table, sink.figures(), pl.read_parquet_schema(written.path))
    checks.append(publish(context, trino, warehouse, [task.table, "quarantine"], ds, source, guard))
    return checks, stage_metadata(trino, written, quarantined, outcome, sink)


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
    """Answers of one Batch API batch (table `distilled`), each request exactly as submitted."""
    settings = llama.settings()
    with ApiStore(settings.paths) as store:
        batch = store.batch(context.partition_key)
        if batch is None or batch.ds is None or batch.source is None:
            raise dg.Failure(f"no landed Batch API batch {context.partition_key}")
        ds, source = batch.ds, batch.source
        lines = batch_lines(settings, batch)
        task = ApiBatchTask(batch_id=batch.id, lines=lines, source_file=f"{batch.id}.jsonl")
        with partition_lease(context, warehouse, ds, source) as held:
            ledger = held.ledger
            # A compare-and-set: a cancel that landed since the batch was read is not lost.
            started = begin_batch(
                store,
                batch.id,
                run_id=context.run.run_id,
                by_hand=API_TRIGGER_TAG not in context.run.tags,
            )
            if started is None:
                finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
                raise dg.Failure(f"{batch.id} was cancelled before its run started")
            batch = started
            groups = task.load(lambda table, model: []).groups()
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
                done = finish_batch(store, ledger, batch.id, lines, BatchStatus.CANCELLED)
                raise dg.Failure(
                    f"{batch.id} was cancelled: {done.request_total - done.request_failed} of "
                    f"{done.request_total} requests answered (kept; a rerun sends the rest)"
                )
            outcome = _merged(outcomes)
            checks, metadata = _land(
                context, task, outcome, ledger,
                warehouse=warehouse.warehouse(), trino=trino, ds=ds, source=source,
                guard=held.check,
            )  # fmt: skip
            # Completed once its rows are in the table (and Trino): then the files, then the status.
            status = BatchStatus.EXPIRED if outcome.stopped_at_window else BatchStatus.COMPLETED
            done = finish_batch(store, ledger, batch.id, lines, status, outcomes=outcomes)
    metadata |= {
        "batch_id": dg.MetadataValue.text(batch.id),
        "system_prompts": len(groups),
        "batch_status": dg.MetadataValue.text(done.status.value),
    }
    return dg.MaterializeResult(metadata=metadata, check_results=checks)
