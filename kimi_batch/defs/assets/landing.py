"""What Dagster records of a landed partition: its materialization metadata, the checks every
generation stage declares and their results, and the landing itself.

`land_stage` writes a stage's partition (`pipeline.write_stage`) and judges its checks. An asset
step's one partition is recorded by Dagster when the step returns its result; the nightly op's
many partitions are each recorded as they land (`record`). Only an asset step records a data version (`pipeline.stage_data_version`): `record` (the
one place a run logs materializations it made outside an asset step, with Dagster's public
events only) cannot, since Dagster's public `AssetMaterialization` has no data version. The
night's partitions get theirs from their own asset runs (`defs/night_versions.py`).

Metadata people can read: rounded to what the figures mean, units in the keys. Dagster plots
numeric metadata over a partition's materializations, so every figure stays a number
(`pipeline.generation_figures`); the `summary` entry repeats the latest ones as a small Markdown
table for the UI. Every table materialization also carries Dagster's standard keys
(`table_metadata`): the row counts, the table's name in Trino, its URI and its column schema from
the row models, which fill the catalog's row-count chart, schema tab and table name. Dagster
spells these keys in `TableMetadataSet`/`UriMetadataSet`, which `dagster` 1.13 does not export:
they are named once here, their values built with the public `dg.TableSchema`/`dg.TableColumn`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg
import polars as pl

from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.resources import TrinoResource
from kimi_batch.engine import BatchOutcome, GenerationResult
from kimi_batch.pipeline import (
    CHECK_NAMES,
    CheckFigures,
    CheckVerdict,
    GenerationTask,
    HeldPartition,
    StagePlan,
    StageSink,
    generation_figures,
    generation_verdicts,
    quality_verdicts,
    stage_data_version,
    summary_markdown,
    write_stage,
)
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.warehouse import PARTITION_COLUMNS, TABLES, PartitionWrite, Warehouse, columns

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
) -> dict[str, dg.RawMetadataValue]:
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
    checks: Sequence[dg.AssetCheckResult], metadata: Mapping[str, dg.RawMetadataValue]
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


Task = GenerationTask[Any, Any]


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
) -> dict[str, dg.RawMetadataValue]:
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
