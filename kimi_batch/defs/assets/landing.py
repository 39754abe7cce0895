"""Landing one partition of a stage as Dagster records it: `land_stage` writes it
(`pipeline.write_stage`) and judges its checks; a `Landing` then says what is recorded.
`StepLanding` (an asset's one partition) leaves the record to Dagster's step; `NightLanding` (the
nightly op, many partitions) records each partition as it lands.

Only an asset step records a data version (`pipeline.stage_data_version`): `record` (the one
place a run logs materializations it made outside an asset step, with Dagster's public events
only) cannot, since Dagster's public `AssetMaterialization` has no data version. The night's
partitions get theirs from their own asset runs (`defs/night_versions.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import dagster as dg

from kimi_batch.defs.assets.checks import check_results, generation_checks
from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.metadata import on_table, table_metadata
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.engine import BatchOutcome, GenerationResult
from kimi_batch.pipeline import (
    GenerationTask,
    HeldPartition,
    StagePlan,
    StageSink,
    generation_figures,
    quality_verdicts,
    stage_data_version,
    summary_markdown,
    write_stage,
)
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.warehouse import PartitionWrite, Warehouse

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


class Landing(Protocol):
    """What happens to a partition once its rows are committed: its record."""

    def landed(
        self,
        asset: dg.AssetKey,
        key: str,
        tables: Sequence[str],
        held: HeldPartition,
        result: dg.MaterializeResult,
    ) -> dg.MaterializeResult:
        """The partition's result, as recorded."""
        ...


@dataclass(frozen=True)
class StepLanding:
    """An asset step's landing: Dagster records the result the step returns."""

    def landed(
        self,
        asset: dg.AssetKey,
        key: str,
        tables: Sequence[str],
        held: HeldPartition,
        result: dg.MaterializeResult,
    ) -> dg.MaterializeResult:
        return result


@dataclass(frozen=True)
class NightLanding:
    """The nightly op's landing: each partition recorded as it lands (`record`), from the
    caller's thread (the driver's landing thread; the op's, for the seeds)."""

    context: RunContext

    def landed(
        self,
        asset: dg.AssetKey,
        key: str,
        tables: Sequence[str],
        held: HeldPartition,
        result: dg.MaterializeResult,
    ) -> dg.MaterializeResult:
        record(self.context, asset, key, result)
        return result
