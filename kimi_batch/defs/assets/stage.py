"""One asset per generation stage: `generation_asset(...)` turns a `GenerationTask` into a
partitioned, pooled asset; `run_stage` is what every such asset runs.

The run, for any stage: read its inputs, build its requests, run them under the partition's lease
(the ledger skips what is done), ask again what the stage wants asked again, stream the results
from the ledger through the stage's `StageSink` into the partition's Parquet, then write the
sink's quarantine rows, publish to Trino and judge the checks.
"""

# No `from __future__ import annotations`: Dagster reads the asset function's annotations.

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import polars as pl

from kimi_batch.defs.assets._generation import (
    BATCH_GROUP,
    LLAMA_POOL,
    HeldPartition,
    RunContext,
    check_specs,
    generation_checks,
    partition_lease,
    publish,
    read_rows,
    run_batch,
)
from kimi_batch.defs.metadata import generation_figures, summary_table
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.partitions import partition_parts
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.defs.stages import StageConfig
from kimi_batch.engine import BatchOutcome, GenerationRequest, GenerationResult, Ledger
from kimi_batch.storage import PartitionWrite, Warehouse, replace_quarantine
from kimi_batch.tasks.quarantine import INPUT_STAGE
from kimi_batch.tasks.sink import StageSink
from kimi_batch.tasks.stage import GenerationTask, RowReader
from kimi_batch.tasks.stages import register_stage

__all__ = [
    "StageConfig",
    "StagePlan",
    "asked_again",
    "generation_asset",
    "land_stage",
    "plan_stage",
    "run_stage",
    "sample_scope",
    "stage_metadata",
]

Task = GenerationTask[Any, Any]


class _FixedTask(StageConfig):
    """No run config: the asset runs the task it was made with."""


def generation_asset(
    *,
    name: str,
    task: type[StageConfig] | Task,
    partitions: dg.PartitionsDefinition,
    description: str,
    deps: Sequence[dg.AssetsDefinition | str] = (),
    tags: Mapping[str, str] | None = None,
) -> dg.AssetsDefinition:
    """The asset `name` of one stage over `partitions` (the deployment's batch partitions,
    `kimi_batch.defs.partitions.build_batch_partitions`), in the llama pool, with the checks.

    `task` is a `StageConfig` class (run config builds the task) or a task (no run config).
    """
    config_type = task if isinstance(task, type) else _FixedTask
    fixed = None if isinstance(task, type) else task
    if fixed is not None:
        register_stage(type(fixed))

    def materialize(
        context: dg.AssetExecutionContext,
        config: StageConfig,
        llama: LlamaServerResource,
        digest: DigestResource,
        warehouse: WarehouseResource,
        trino: TrinoResource,
    ) -> dg.MaterializeResult:
        stage = fixed or config.task(llama.settings())
        return run_stage(
            context, stage, llama=llama, digest=digest, warehouse=warehouse, trino=trino
        )

    # Dagster takes the run-config schema from the annotation: this stage's own config class.
    materialize.__annotations__["config"] = config_type
    return dg.asset(
        name=name,
        description=description,
        partitions_def=partitions,
        group_name=BATCH_GROUP,
        pool=LLAMA_POOL,
        kinds={"parquet", "trino"},
        check_specs=check_specs(name, partitions),
        deps=list(deps),
        tags=dict(tags or {}),
    )(materialize)


@dataclass(frozen=True)
class StagePlan:
    """One partition of one stage before generation: its inputs, requests and input version."""

    task: Task
    ds: str
    source: str
    inputs: Any
    requests: list[GenerationRequest]
    input_sha: str


def sample_scope(task: Task, ds: str, source: str) -> str:
    """Where a stage's input rows live: a request that samples (not greedy, no fixed seed) is
    this partition's own, apart from the same request asked in another partition or stage."""
    return f"{task.name}|{ds}|{source}"


def plan_stage(task: Task, store: Warehouse, ds: str, source: str) -> StagePlan:
    """Read the partition's inputs of `task` and build its requests (each row its own sample)."""
    register_stage(type(task))
    reader: RowReader = lambda table, model: read_rows(store, table, ds, source, model)  # noqa: E731
    inputs = task.load(reader)
    scope = sample_scope(task, ds, source)
    return StagePlan(
        task=task,
        ds=ds,
        source=source,
        inputs=inputs,
        requests=[r.model_copy(update={"sample_scope": scope}) for r in task.requests(inputs)],
        input_sha=consumed_input_sha(store, ds, source),
    )


def run_stage(
    context: dg.AssetExecutionContext,
    task: Task,
    *,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Generate the partition's rows of `task`'s table (see the module docstring)."""
    ds, source = partition_parts(context)
    store = warehouse.warehouse()
    plan = plan_stage(task, store, ds, source)
    with partition_lease(context, warehouse, ds, source) as held:
        ledger = held.ledger
        outcome = run_batch(context, llama, digest, ledger, plan.requests)
        results = outcome.iter_results(ledger)
        if task.asks_again:
            results = asked_again(
                context,
                ledger,
                plan,
                outcome,
                rerun=lambda again: run_batch(context, llama, digest, ledger, again),
            )
        return land_stage(context, plan, held, outcome, results, store=store, trino=trino)


def land_stage(
    context: RunContext,
    plan: StagePlan,
    held: HeldPartition,
    outcome: BatchOutcome,
    results: Iterable[GenerationResult],
    *,
    store: Warehouse,
    trino: TrinoResource,
    publish_now: bool = True,
) -> dg.MaterializeResult:
    """Write the partition's rows and quarantine, publish, judge the checks (lease held).

    `publish_now=False` leaves the Trino publish and its check to the caller (the nightly run
    publishes after its last batch, off the generation path)."""
    task, ds, source = plan.task, plan.ds, plan.source
    sink = StageSink(task, plan.inputs, input_sha256=plan.input_sha)
    written = store.write_partition(task.table, ds, source, sink.rows(results), guard=held.check)
    sink.failed(
        outcome.failures,
        source_file=source,
        model=outcome.model,
        digest_sha=outcome.digest_sha256,
        created_at=datetime.now(UTC),
    )
    quarantined = replace_quarantine(
        store, ds, source, task.name, sink.quarantined, guard=held.check
    )
    checks = generation_checks(task.table, sink.figures(), pl.read_parquet_schema(written.path))
    if publish_now:
        checks.append(
            publish(context, trino, store, [task.table, "quarantine"], ds, source, held.check)
        )
    metadata = stage_metadata(trino, written, quarantined, outcome, sink)
    metadata[INPUT_SHA_METADATA] = plan.input_sha  # what `status` and the nightly compare (stale)
    return dg.MaterializeResult(metadata=metadata, check_results=checks)


def consumed_input_sha(store: Warehouse, ds: str, source: str) -> str:
    """The landed input version the partition's `seeds` were built from ("" before any).

    A file of only bad lines leaves no seed row: the version is then its input quarantine rows'
    (every line set aside is stamped with it), so the partition consumed its input, its outputs
    are empty, and it is not stale the next night.
    """
    shas = store.read_partition("seeds", ds, source).get_column("input_sha256").drop_nulls()
    if shas.is_empty():
        set_aside = store.read_partition("quarantine", ds, source)
        shas = set_aside.filter(pl.col("stage") == INPUT_STAGE).get_column("input_sha256")
        shas = shas.drop_nulls()
    return str(shas.unique().sort()[-1]) if len(shas) else ""


def stage_metadata(
    trino: TrinoResource,
    written: PartitionWrite,
    quarantined: int,
    outcome: BatchOutcome,
    sink: StageSink[Any, Any],
) -> "dict[str, dg.RawMetadataValue]":
    metadata: dict[str, dg.RawMetadataValue] = {
        "rows": written.rows,
        "quarantined": quarantined,
        **generation_figures(outcome),
        **sink.metadata(),
        "path": dg.MetadataValue.path(str(written.path)),
    }
    if trino.enabled:
        name = trino.table_name(written.table)
        metadata["trino_table"] = name
        metadata["query"] = dg.MetadataValue.md(f"```sql\nSELECT * FROM {name} LIMIT 100\n```")
    metadata["summary"] = summary_table(metadata)
    return metadata


def asked_again(
    context: RunContext,
    ledger: Ledger,
    plan: StagePlan,
    outcome: BatchOutcome,
    *,
    rerun: Callable[[list[GenerationRequest]], BatchOutcome],
) -> Iterator[GenerationResult]:
    """The batch's results, each one the stage asks again for replaced by its new answer
    (`rerun` runs the new requests)."""
    task, requests = plan.task, plan.requests
    by_id = {row.request_id: req for row, req in zip(outcome.planned, requests, strict=True)}
    again: dict[str, GenerationRequest] = {}
    for result in outcome.iter_results(ledger):
        retry = task.retry(by_id[result.request_id], result)
        if retry is not None:
            again[result.request_id] = retry
    context.log.info(f"asking again for {len(again)} answer(s) of the {task.name} stage")
    retried = rerun(list(again.values())) if again else None
    replacements = {
        (r.input_id, r.tag): r for r in (retried.iter_results(ledger) if retried else ())
    }
    for result in outcome.iter_results(ledger):
        replaced = replacements.get((result.input_id, result.tag))
        yield replaced if replaced is not None and result.request_id in again else result
