"""Landing one partition of a stage: its rows and quarantine committed, its checks, its record.

`land_stage` writes a planned partition's rows; a `Landing` then says what is recorded. A commit
is the publication: Trino, polars and pyiceberg read the tables' catalog and see it on their next
query, so nothing is registered after it. `StepLanding` (an asset's one partition) leaves the
record to Dagster's step; `NightLanding` (the nightly op, many partitions) records each partition
as it lands.

A stage's partition has a data version (`stage_data_version`) made from what determines its
rows: its input version and its requests' identities (the ledger answers each request once), so a
partition built twice from the same input by the same stage carries the same version, whichever
run built it. Only an asset step records it: `record` (the one place a run logs materializations
it made outside an asset step, with Dagster's public events only) cannot, since Dagster's public
`AssetMaterialization` has no data version. The night's partitions get theirs from their own
asset runs (`defs/night_versions.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import dagster as dg
import polars as pl

from kimi_batch.crash_points import crash_point
from kimi_batch.defs.assets.checks import generation_checks
from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.assets.quality import quality_checks, screening
from kimi_batch.defs.metadata import generation_figures, on_table, summary_table, table_metadata
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.engine import BatchOutcome, GenerationResult
from kimi_batch.pipeline import INPUT_STAGE, GenerationTask, HeldPartition, StagePlan, StageSink
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.storage import replace_quarantine
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
    """Write the partition's rows and quarantine, judge the checks (lease held).

    A quality-gated stage's rows pass `gate` on their way to the table (contamination and
    duplicates set aside, `defs.assets.quality`); its index takes the kept rows once the rows
    and the quarantine are written."""
    task, ds, source = plan.task, plan.ds, plan.source
    sink = StageSink(task, plan.inputs, input_sha256=plan.input_sha)
    with screening(gate, store, task, plan.inputs, (ds, source), held) as screen:
        rows = sink.rows(results)
        written = store.write_partition(
            task.table, ds, source, screen.admit(rows) if screen else rows, guard=held.lease
        )
        crash_point("stage.rows_written")
        sink.failed(
            outcome.failures,
            source_file=source,
            model=outcome.model,
            digest_sha=outcome.digest_sha256,
            created_at=datetime.now(UTC),
        )
        set_aside = [*sink.quarantined, *(screen.quarantined if screen else ())]
        quarantined = replace_quarantine(store, ds, source, task.name, set_aside, guard=held.lease)
    checks = generation_checks(
        task.table, sink.figures(), store.partition_schema(task.table, ds, source)
    )
    if task.quality_gated and gate is not None:
        checks.extend(quality_checks(screen, gate))
    metadata = stage_metadata(trino, written, quarantined, outcome, sink, screen)
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
        data_version=stage_data_version(plan, outcome),
    )


def stage_data_version(plan: StagePlan, outcome: BatchOutcome) -> dg.DataVersion:
    """The partition's data version: its table, input version, and the ids of the requests its
    rows come from and of those that failed (each id names a ledger key: digest, model, params,
    messages, sample), so the same input through the same stage gives the same version."""
    digest = hashlib.sha256(f"{plan.task.table}\n{plan.input_sha}\n".encode())
    for request_id in sorted(row.request_id for row in outcome.planned):
        digest.update(f"{request_id}\n".encode())
    for request_id in sorted(failure.request_id for failure in outcome.failures):
        digest.update(f"failed {request_id}\n".encode())
    return dg.DataVersion(digest.hexdigest())


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
    metadata["summary"] = summary_table(metadata)
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
