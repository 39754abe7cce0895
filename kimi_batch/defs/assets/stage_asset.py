"""A generation stage as Dagster runs it: its asset, its step's driver, and what Dagster records
of each partition it lands.

One asset per declared stage: `generation_asset(...)` turns a `GenerationTask` into a
partitioned, pooled asset; `run_stage` is what every such asset runs: the partition-batch driver
(`kimi_batch.pipeline.drive`, through `run_partitions`) over the asset's one partition, under its
lease: read its inputs, build its requests, run them (the ledger skips what is done), ask again
what the stage wants asked again, stream the results from the ledger through the stage's
`StageSink` into the partition's table, write the sink's quarantine rows, and judge the checks
before the step returns its result. The nightly op and the Batch API's asset run the same driver
over their partitions.

The driver as Dagster runs it: the step's log, the deployment's engine session under the nightly
window, the partition's lease (a partition the pipeline skips fails the step), its landing
(`land_stage`) and, for the night's partitions, its record as it lands (`on_landed`), on an event
loop a terminated run stops for certain (`engine/deployment.py`, raising Dagster's own interrupt
once the loop has stopped).

The landing: `land_stage` writes a stage's partition (`pipeline.write_stage`) and judges its
checks. An asset step's one partition is recorded by Dagster when the step returns its result;
the nightly op's many partitions are each recorded as they land (`record`). Only an asset step
records a data version (`pipeline.stage_data_version`): `record` (the one place a run logs
materializations it made outside an asset step, with Dagster's public events only) cannot, since
Dagster's public `AssetMaterialization` has no data version. The night's partitions get theirs
from their own asset runs (`defs/night_versions.py`).

Metadata people can read: rounded to what the figures mean, units in the keys. Dagster plots
numeric metadata over a partition's materializations, so every figure stays a number
(`pipeline.generation_figures`); the `summary` entry repeats the latest ones as a small Markdown
table for the UI. Every table materialization also carries Dagster's standard keys
(`table_metadata`): the row counts, the table's name in Trino, its URI and its column schema from
the row models, which fill the catalog's row-count chart, schema tab and table name. Dagster
spells these keys in `TableMetadataSet`/`UriMetadataSet`, which `dagster` 1.13 does not export:
they are named once here, their values built with the public `dg.TableSchema`/`dg.TableColumn`.
"""

# No `from __future__ import annotations`: Dagster reads the asset function's annotations (the
# few that name a type `dagster` declares for type checkers only are quoted).

import warnings
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

import dagster as dg
import polars as pl
from pydantic import BaseModel, Field, create_model

from kimi_batch.defs.jobs import BATCH_GROUP, NIGHT_RUN_TAG, STOPPED_TAG, WINDOW_TAG
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.partitions import DATE_DIMENSION, SOURCE_DIMENSION
from kimi_batch.defs.resources import (
    DigestResource,
    LlamaServerResource,
    TrinoResource,
    WarehouseResource,
)
from kimi_batch.engine import (
    BatchOutcome,
    BatchRun,
    GenerationResult,
    InterruptibleRunner,
    Ledger,
    ProgressEvent,
    notify,
)
from kimi_batch.engine import interruptible_runner as engine_runner
from kimi_batch.pipeline import (
    CHECK_NAMES,
    BatchControls,
    CheckFigures,
    CheckVerdict,
    GenerationTask,
    HeldPartition,
    PartitionResult,
    PartitionSkippedError,
    PipelineStage,
    StageConfigError,
    StageDeclaration,
    StagePlan,
    StageSink,
    drive_on,
    generation_figures,
    generation_verdicts,
    partition_lease,
    partition_parts_of,
    plan_stage,
    quality_verdicts,
    stage_data_version,
    summary_markdown,
    write_stage,
)
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.settings import Settings
from kimi_batch.warehouse import PARTITION_COLUMNS, TABLES, PartitionWrite, Warehouse, columns

Task = GenerationTask[Any, Any]

# ---- what Dagster records of a landed partition -------------------------------------------------


# An asset's step (one partition) or the nightly op's (many): what the helpers read of it.
RunContext = dg.AssetExecutionContext | dg.OpExecutionContext

ROW_COUNT = "dagster/row_count"
PARTITION_ROW_COUNT = "dagster/partition_row_count"
TABLE_NAME = "dagster/table_name"
URI = "dagster/uri"
COLUMN_SCHEMA = "dagster/column_schema"
# The Iceberg snapshot of the table that a materialization's commit made current.
SNAPSHOT_ID = "snapshot_id"
# Who answers for every asset of the pipeline (the UI's owner filter and catalog column).
ASSET_OWNERS = ["team:kimi-batch"]


def table_schema(table: str) -> dg.TableSchema:
    """The table's columns as its row model declares them (`warehouse.schema`'s Trino types), the
    partition columns last."""
    model = TABLES[table]
    fields = [
        dg.TableColumn(
            name=column.name,
            type=column.trino,
            description=model.model_fields[column.name].description,
            constraints=dg.TableColumnConstraints(nullable=column.nullable),
        )
        for column in columns(model)
    ]
    partition_columns = [
        dg.TableColumn(
            name=name,
            type="VARCHAR",
            description="partition column",
            constraints=dg.TableColumnConstraints(nullable=False),
        )
        for name in PARTITION_COLUMNS
    ]
    return dg.TableSchema(columns=[*fields, *partition_columns])


def table_metadata(
    table: str,
    *,
    table_name: str,
    uri: str,
    table_rows: int,
    partition_rows: int | None = None,
    snapshot_id: int | None = None,
) -> "dict[str, dg.RawMetadataValue]":
    """Dagster's standard table keys: rows in the whole table (and in the partition written),
    the Trino table, the Iceberg table's location and the column schema; and the table's
    snapshot the write made current (`kimi-batch export --as-of` reads it back)."""
    metadata: dict[str, dg.RawMetadataValue] = {
        ROW_COUNT: dg.MetadataValue.int(table_rows),
        TABLE_NAME: dg.MetadataValue.text(table_name),
        URI: dg.MetadataValue.text(uri),
        COLUMN_SCHEMA: dg.MetadataValue.table_schema(table_schema(table)),
    }
    if partition_rows is not None:
        metadata[PARTITION_ROW_COUNT] = dg.MetadataValue.int(partition_rows)
    if snapshot_id is not None:
        # Text: a snapshot id is a 63-bit number, past what the UI's numeric charts keep exact.
        metadata[SNAPSHOT_ID] = dg.MetadataValue.text(str(snapshot_id))
    return metadata


def on_table(
    checks: Sequence[dg.AssetCheckResult], metadata: "Mapping[str, dg.RawMetadataValue]"
) -> list[dg.AssetCheckResult]:
    """`checks` with the table name and URI of the materialization they judged (`metadata`)."""
    keys = {key: metadata[key] for key in (TABLE_NAME, URI) if key in metadata}
    return [check.with_metadata({**check.metadata, **keys}) for check in checks]


# ---- the checks ---------------------------------------------------------------------------------


def check_results(verdicts: Iterable[CheckVerdict]) -> list[dg.AssetCheckResult]:
    """The verdicts as Dagster's check results (a `warn` verdict at WARN severity)."""
    return [
        dg.AssetCheckResult(
            check_name=verdict.name,
            passed=verdict.passed,
            metadata=verdict.metadata,
            severity=dg.AssetCheckSeverity.WARN if verdict.warn else dg.AssetCheckSeverity.ERROR,
        )
        for verdict in verdicts
    ]


def generation_checks(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[dg.AssetCheckResult]:
    """Every stage's checks of a partition (`pipeline.generation_verdicts`)."""
    return check_results(generation_verdicts(table, figures, written))


def check_specs(
    asset: str,
    partitions_def: dg.PartitionsDefinition,
    names: Sequence[str] = CHECK_NAMES,
) -> list[dg.AssetCheckSpec]:
    """Partitioned like the asset, so each partition's check state is its own (UI, alerts)."""
    with warnings.catch_warnings():
        # Partitioned check specs are a Dagster preview; the warning would print before every
        # CLI command's output (its one-line errors, the demo's progress bars).
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(name, asset=asset, partitions_def=partitions_def) for name in names
        ]


# ---- the landing --------------------------------------------------------------------------------


def land_stage(
    context: RunContext,
    plan: StagePlan,
    held: HeldPartition,
    outcome: BatchOutcome,
    results: Iterable[GenerationResult],
    *,
    store: Warehouse,
    trino: TrinoResource,
    gate: QualityGate | None = None,
) -> dg.MaterializeResult:
    """Write the partition's rows and quarantine (`pipeline.write_stage`, screened by `gate`),
    judge the checks (lease held)."""
    task, ds, source = plan.task, plan.ds, plan.source
    write = write_stage(plan, held, outcome, results, store=store, gate=gate)
    written, screen = write.written, write.screen
    checks = generation_checks(
        task.table, write.sink.figures(), store.partition_schema(task.table, ds, source)
    )
    if task.quality_gated and gate is not None:
        checks.extend(check_results(quality_verdicts(screen, gate)))
    metadata = stage_metadata(trino, written, write.quarantined, outcome, write.sink, screen)
    metadata.update(
        table_metadata(
            task.table,
            table_name=trino.table_name(task.table),
            uri=written.location,
            table_rows=store.count(task.table),
            partition_rows=written.rows,
            snapshot_id=written.snapshot_id,
        )
    )
    metadata[INPUT_SHA_METADATA] = plan.input_sha  # what `status` and the nightly compare (stale)
    return dg.MaterializeResult(
        metadata=metadata,
        check_results=on_table(checks, metadata),
        data_version=dg.DataVersion(stage_data_version(plan, outcome)),
    )


def stage_metadata(
    trino: TrinoResource,
    written: PartitionWrite,
    quarantined: int,
    outcome: BatchOutcome,
    sink: StageSink[Any, Any],
    screen: PartitionGate | None = None,
) -> "dict[str, dg.RawMetadataValue]":
    metadata: dict[str, dg.RawMetadataValue] = {
        "rows": written.rows,
        "quarantined": quarantined,
        **generation_figures(outcome),
        **sink.metadata(),
        **(screen.metadata() if screen else {}),
    }
    # The file and the Trino table are Dagster's `dagster/uri` and `dagster/table_name`.
    if trino.enabled:
        name = trino.table_name(written.table)
        metadata["query"] = dg.MetadataValue.md(f"```sql\nSELECT * FROM {name} LIMIT 100\n```")
    metadata["summary"] = dg.MetadataValue.md(summary_markdown(metadata))
    return metadata


def record(
    context: RunContext,
    asset: dg.AssetKey,
    key: str,
    result: dg.MaterializeResult,
    *,
    materialized: bool = True,
) -> None:
    """Log the partition's materialization (unless only its checks are new) and its check
    evaluations, as an asset step over it would (see the module docstring on data versions)."""
    if materialized:
        context.log_event(dg.AssetMaterialization(asset, partition=key, metadata=result.metadata))
    for check in result.check_results or ():
        # Dagster's docs log an op's check evaluations this way; its `UserEvent` hint omits them.
        context.log_event(
            dg.AssetCheckEvaluation(  # pyright: ignore[reportArgumentType]
                asset_key=asset,
                check_name=check.check_name or "",
                passed=check.passed,
                metadata=check.metadata,
                severity=check.severity,
                partition=key,
            )
        )


# ---- the step: its pool, lease and failure ------------------------------------------------------


T = TypeVar("T")

# The Dagster pool of every step that sends requests to the server (dagster.yaml: limit 1).
LLAMA_POOL = "llama_server"


@contextmanager
def failing_step() -> Iterator[None]:
    """A partition the pipeline skips (`PartitionSkippedError`), or a stage's config it refuses
    (`StageConfigError`), fails the step as Dagster's `Failure`: its message, shown without a
    traceback."""
    try:
        yield
    except (PartitionSkippedError, StageConfigError) as error:
        raise dg.Failure(str(error)) from error


@contextmanager
def step_lease(
    context: RunContext, warehouse: WarehouseResource, ds: str, source: str
) -> Iterator[HeldPartition]:
    """The partition's lease for this run; one it cannot hold, or loses, fails the step."""
    with failing_step(), partition_lease(warehouse.ledger, ds, source, context.run.run_id) as held:
        yield held


# ---- the event loop a terminated run stops ------------------------------------------------------


@contextmanager
def interruptible_runner() -> Iterator[InterruptibleRunner]:
    """`asyncio.Runner()` for a Dagster step; closed on exit."""
    with engine_runner(dg.DagsterExecutionInterruptedError) as runner:
        yield runner


def run_interruptibly(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` for a Dagster step: a terminated run cancels `main`."""
    with interruptible_runner() as runner:
        return runner.run(main)


# ---- the nightly window -------------------------------------------------------------------------


def window_end(context: RunContext) -> datetime | None:
    """The run's nightly window end (its WINDOW_TAG), None without one."""
    raw = context.run.tags.get(WINDOW_TAG)
    if not raw:
        return None
    end = datetime.fromisoformat(raw)
    return end if end.tzinfo else end.replace(tzinfo=UTC)


def stopped_at_window(context: dg.AssetExecutionContext, outcome: BatchOutcome) -> dg.Failure:
    """The failure of an asset's partition that the nightly window cut short (the run marked
    so): it fails visibly with what is done, the next night's catch-up continues from the
    ledger."""
    stats = outcome.stats
    done = stats.generated + stats.from_ledger
    mark_stopped_at_window(context)
    return dg.Failure(
        f"the nightly window ended at {window_end(context)}: {done} of {stats.total} rows "
        "done, resumes next night",
        metadata={"rows_done": done, "rows_total": stats.total, **generation_figures(outcome)},
    )


# Dagster's run tag: whether run retries re-execute a run that failed in a step.
RETRY_ON_STEP_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"


def mark_stopped_at_window(context: RunContext) -> None:
    """Tag the run STOPPED_TAG=true (`status` and the morning alerts name it so) and not to be
    retried: past the window a retry would send nothing, the next night resumes the work."""
    context.instance.add_run_tags(
        context.run.run_id, {STOPPED_TAG: "true", RETRY_ON_STEP_FAILURE_TAG: "false"}
    )


# ---- the engine session -------------------------------------------------------------------------


def _progress_reporter(context: RunContext, label: str) -> Callable[[ProgressEvent], None]:
    """The run log gets the periodic line; in-process listeners (a terminal bar) the event."""

    def report(event: ProgressEvent) -> None:
        context.log.info(str(event))
        notify(event.model_copy(update={"label": label}))

    return report


@asynccontextmanager
async def engine_session(
    context: RunContext,
    llama: LlamaServerResource,
    digest: DigestResource,
    ledger: Ledger,
    *,
    label: str,
    expires_at: datetime | None = None,
) -> AsyncIterator[BatchRun]:
    """One engine run under the run's window and the work's own end (`expires_at`, whichever
    comes first), open while the block adds requests to it (a batch's outcome says whether
    either cut it short); progress is logged as `label`."""
    ends = [end for end in (window_end(context), expires_at) if end is not None]
    reporter = _progress_reporter(context, label)
    session = llama.server().session(
        digest.load(), ledger, on_progress=reporter, stop_at=min(ends, default=None)
    )
    async with session as run:
        yield run


# ---- the driver ---------------------------------------------------------------------------------

# A partition's plan of a stage (default `plan_stage`: its inputs read from the warehouse).
Planner = Callable[[Task, str], StagePlan]
# What is done with a partition's result as it lands (the night op logs it: `record` above).
OnLanded = Callable[[dg.AssetKey, str, dg.MaterializeResult], None]


@dataclass(frozen=True)
class GenerationResources:
    """The resources a stage's run uses, as one bundle."""

    llama: LlamaServerResource
    digest: DigestResource
    warehouse: WarehouseResource
    trino: TrinoResource

    @property
    def settings(self) -> Settings:
        """The deployment's one `Settings`, which every resource holds."""
        return self.llama.settings()


def _plan_from(store: Warehouse, task: Task, key: str) -> StagePlan:
    return plan_stage(task, store, *partition_parts_of(key))


@dataclass(frozen=True)
class _StepRun:
    """What the driver asks of a Dagster step (`kimi_batch.pipeline.DriverRun`)."""

    context: RunContext
    resources: GenerationResources
    store: Warehouse
    on_landed: OnLanded | None
    ledger: Ledger
    planner: Planner
    controls: BatchControls

    def log(self, message: str) -> None:
        self.context.log.info(message)

    def plan(self, task: Task, key: str) -> StagePlan:
        return self.planner(task, key)

    def session(self, label: str) -> AbstractAsyncContextManager[BatchRun]:
        llama, digest = self.resources.llama, self.resources.digest
        expires_at = self.controls.expires_at
        return engine_session(
            self.context, llama, digest, self.ledger, label=label, expires_at=expires_at
        )

    def land(
        self,
        asset: str,
        key: str,
        plan: StagePlan,
        held: HeldPartition,
        outcome: BatchOutcome,
        results: Iterable[GenerationResult],
    ) -> dg.MaterializeResult:
        """The partition's rows of the stage written, then handed to `on_landed`."""
        written = land_stage(
            self.context,
            plan,
            held,
            outcome,
            results,
            store=self.store,
            trino=self.resources.trino,
            # Only a gated stage's rows pass the gate: another opens no duplicate index.
            gate=self.resources.warehouse.quality_gate() if plan.task.quality_gated else None,
        )
        if self.on_landed is not None:
            self.on_landed(dg.AssetKey(asset), key, written)
        return written


def run_partitions(
    context: RunContext,
    stages: Sequence[PipelineStage],
    partitions: Mapping[str, HeldPartition],
    *,
    ledger: Ledger,
    resources: GenerationResources,
    on_landed: OnLanded | None = None,
    planner: Planner | None = None,
    controls: BatchControls | None = None,
) -> dict[str, PartitionResult[dg.MaterializeResult]]:
    """`stages` over every held partition (key -> lease) in one engine run, each partition
    landed stage by stage (`kimi_batch.pipeline.drive`) and handed to `on_landed` (an asset step
    leaves its one result to Dagster); every partition's result, in `partitions`' order.
    `planner` makes a partition's plan of a stage (default `plan_stage`); `controls` add a stop
    time, a cancel poll (a cancel raises `BatchCancelledError`, nothing lands) and a hook on the
    planned keys."""
    store = resources.warehouse.warehouse()
    controls = controls or BatchControls()
    planner = planner or partial(_plan_from, store)
    run = _StepRun(context, resources, store, on_landed, ledger, planner, controls)
    return drive_on(run_interruptibly, run, stages, partitions, controls)


# ---- the asset ----------------------------------------------------------------------------------


def dagster_config(model: type[BaseModel]) -> Any:
    """Dagster's run-config schema of a pydantic config class (the launchpad shows its fields and
    defaults): the class itself, read as a `dg.Config` (no function's annotations rewritten); the
    step validates its `op_config` with the class."""
    return _as_dagster(model).to_config_schema()


def _as_dagster(model: type[BaseModel]) -> type[dg.Config]:
    """`model` as a `dg.Config` subclass, and so each field that is a pydantic model (Dagster
    reads nested `dg.Config` classes only)."""
    if issubclass(model, dg.Config):
        return model
    nested: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            inner = _as_dagster(kind)
            nested[name] = (inner, Field(default_factory=inner, description=field.description))
    derived: type[dg.Config] = create_model(  # pyright: ignore[reportAssignmentType]
        model.__name__, __base__=(model, dg.Config), __doc__=model.__doc__, **nested
    )
    return derived


def generation_asset(
    declaration: StageDeclaration,
    *,
    partitions: dg.PartitionsDefinition,
    tags: Mapping[str, str] | None = None,
    checks: Sequence[str] = CHECK_NAMES,
) -> dg.AssetsDefinition:
    """The asset of a declared stage over `partitions` (the deployment's batch partitions,
    `kimi_batch.defs.partitions.build_batch_partitions`), in the llama pool, with the checks
    `checks` (`stage_check_names` of its task class); its run config is the declaration's
    config class (none: the task's defaults)."""
    config_type = declaration.config

    def materialize(
        context: dg.AssetExecutionContext,
        llama: LlamaServerResource,
        digest: DigestResource,
        warehouse: WarehouseResource,
        trino: TrinoResource,
    ) -> dg.MaterializeResult:
        raw = context.op_execution_context.op_config
        config = config_type.model_validate(raw) if config_type else None
        with failing_step():
            stage = declaration.build(config, llama.settings())
        return run_stage(
            context, stage, llama=llama, digest=digest, warehouse=warehouse, trino=trino
        )

    return dg.asset(
        name=declaration.asset,
        description=declaration.description,
        partitions_def=partitions,
        group_name=BATCH_GROUP,
        pool=LLAMA_POOL,
        kinds={"parquet", "trino"},
        owners=ASSET_OWNERS,
        check_specs=check_specs(declaration.asset, partitions, checks),
        deps=list(declaration.reads),
        tags=dict(tags or {}),
        config_schema=dagster_config(config_type) if config_type else None,
    )(materialize)


def run_stage(
    context: dg.AssetExecutionContext,
    task: Task,
    *,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    trino: TrinoResource,
) -> dg.MaterializeResult:
    """Generate the partition's rows of `task`'s table: the driver over this one partition,
    under its lease, committed before the step returns."""
    ds, source = partition_parts(context)
    resources = GenerationResources(llama=llama, digest=digest, warehouse=warehouse, trino=trino)
    with step_lease(context, warehouse, ds, source) as held:
        (result,) = run_partitions(
            context,
            [PipelineStage(context.asset_key.to_user_string(), task)],
            {f"{ds}|{source}": held},
            ledger=held.ledger,
            resources=resources,
            # A version run records what the night landed: never "stopped at the window".
            controls=BatchControls(land_at_window=NIGHT_RUN_TAG in context.run.tags),
        ).values()
        if result.failed is not None:
            with failing_step():
                raise result.failed
    if result.stopped is not None:
        raise stopped_at_window(context, result.stopped)
    assert result.materialized is not None
    return result.materialized


def partition_parts(context: dg.AssetExecutionContext) -> tuple[str, str]:
    """(ds, source) of the partition being materialized."""
    key = context.partition_key
    if not isinstance(key, dg.MultiPartitionKey):
        raise dg.Failure(f"expected a date|source partition key, got {key!r}")
    dims = key.keys_by_dimension
    return dims[DATE_DIMENSION], dims[SOURCE_DIMENSION]
