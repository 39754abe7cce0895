"""Landing one partition of a stage: its Parquet and quarantine, its checks, its Trino publish.

`land_stage` writes a planned partition's rows; a `Landing` then publishes it and says what is
recorded. `PublishNow` (an asset's one partition) publishes before the step returns its result.
`PublishBehind` (the nightly op, many partitions) records each partition as it lands, with a
failing `published_to_trino` check, and publishes it on a background thread while the slots keep
generating: if the night dies before the publish is recorded, the check stays failed and the Trino
catch-up sensor (`defs/publishing.py`) finds it. No partition is ever recorded as materialized
with its publish unaccounted for.

`record` is the one place a run logs materializations it made outside an asset step, with
Dagster's public events only. Such a materialization carries no data version or input versions
(Dagster gives no public way to set them per partition from an op): Dagster's staleness then
compares materialization times, and the input version a partition consumed is its
`input_sha256` metadata, what `status` and the nightly schedule read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, Self

import dagster as dg
import polars as pl

from kimi_batch.crash_points import crash_point
from kimi_batch.defs.assets.checks import generation_checks
from kimi_batch.defs.assets.context import RunContext
from kimi_batch.defs.assets.lease import HeldPartition
from kimi_batch.defs.assets.publish import publish, publish_tables
from kimi_batch.defs.assets.quality import quality_checks, screening
from kimi_batch.defs.check_states import PUBLISHED_CHECK
from kimi_batch.defs.metadata import generation_figures, on_table, summary_table, table_metadata
from kimi_batch.defs.partition_states import INPUT_SHA_METADATA
from kimi_batch.defs.partitions import split_partition_key
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.engine import BatchOutcome, GenerationRequest, GenerationResult, LeaseLostError
from kimi_batch.storage import (
    PartitionGate,
    QualityGate,
    replace_quarantine,
)
from kimi_batch.tasks.generation_task import GenerationTask
from kimi_batch.tasks.quarantine import INPUT_STAGE
from kimi_batch.tasks.sink import StageSink
from kimi_batch.warehouse import PartitionWrite, Warehouse

__all__ = [
    "Landing",
    "PublishBehind",
    "PublishNow",
    "StagePlan",
    "consumed_input_sha",
    "land_stage",
    "partition_parts_of",
    "record",
    "stage_metadata",
]

Task = GenerationTask[Any, Any]


@dataclass(frozen=True)
class StagePlan:
    """One partition of one stage before generation: its inputs, requests and input version."""

    task: Task
    ds: str
    source: str
    inputs: Any
    requests: list[GenerationRequest]
    input_sha: str


def partition_parts_of(key: str) -> tuple[str, str]:
    """(ds, source) of a `date|source` key a run has already checked."""
    parts = split_partition_key(key)
    if parts is None:
        raise ValueError(f"not a date|source partition key: {key!r}")
    return parts


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
    publish_now: bool = True,
) -> dg.MaterializeResult:
    """Write the partition's rows and quarantine, judge the checks, publish (lease held).

    A quality-gated stage's rows pass `gate` on their way to the Parquet (contamination and
    duplicates set aside, `defs.assets.quality`); its index takes the kept rows once the rows
    and the quarantine are written. `publish_now=False` leaves the Trino publish and its check
    to the caller (a `Landing`)."""
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
    if publish_now:
        checks.append(
            publish(context, trino, store, [task.table, "quarantine"], ds, source, held.check)
        )
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
    return dg.MaterializeResult(metadata=metadata, check_results=on_table(checks, metadata))


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


def with_checks(
    result: dg.MaterializeResult, checks: Sequence[dg.AssetCheckResult]
) -> dg.MaterializeResult:
    return dg.MaterializeResult(
        metadata=result.metadata,
        data_version=result.data_version,
        check_results=[*(result.check_results or ()), *checks],
    )


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
    """What happens to a partition once its rows are written: its publish, its record."""

    def landed(
        self,
        asset: dg.AssetKey,
        key: str,
        tables: Sequence[str],
        held: HeldPartition,
        result: dg.MaterializeResult,
    ) -> dg.MaterializeResult:
        """The partition's result with its `published_to_trino` check, as recorded."""
        ...


@dataclass(frozen=True)
class PublishNow:
    """An asset step's landing: published before the step returns; Dagster records the result."""

    context: RunContext
    trino: TrinoResource
    store: Warehouse

    def landed(
        self,
        asset: dg.AssetKey,
        key: str,
        tables: Sequence[str],
        held: HeldPartition,
        result: dg.MaterializeResult,
    ) -> dg.MaterializeResult:
        ds, source = partition_parts_of(key)
        check = publish(self.context, self.trino, self.store, tables, ds, source, held.check)
        return with_checks(result, [check])


def _pending_check() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=PUBLISHED_CHECK,
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"reason": "landed, publishing to Trino", "catch_up": "kimi-batch publish"},
    )


@dataclass(frozen=True)
class _Publishing:
    asset: dg.AssetKey
    key: str
    future: Future[dg.AssetCheckResult]


class PublishBehind:
    """The nightly op's landing (see the module docstring); a context manager around the night.

    One publishing thread: publishes run in landing order, and a partition's next landing waits
    for its previous publish (both register its quarantine table). Check evaluations are logged
    by the caller's thread (the driver's landing thread; the op's, for kept seeds and at the
    end), as each partition lands and when `collect` is called: never two threads at once.
    """

    def __init__(self, context: dg.OpExecutionContext, trino: TrinoResource, store: Warehouse):
        self._context, self._trino, self._store = context, trino, store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trino-publish")
        self._publishing: list[_Publishing] = []
        self.lost: dict[str, str] = {}  # partition key → why its lease was lost before publishing

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.collect(block=True)
        finally:
            self._pool.shutdown(wait=True)

    def landed(
        self,
        asset: dg.AssetKey,
        key: str,
        tables: Sequence[str],
        held: HeldPartition,
        result: dg.MaterializeResult,
    ) -> dg.MaterializeResult:
        if not self._trino.enabled:  # nothing to wait for: recorded with its passed check
            done = PublishNow(self._context, self._trino, self._store).landed(
                asset, key, tables, held, result
            )
            record(self._context, asset, key, done)
            return done
        self.collect(block=True, keys={key})
        recorded = with_checks(result, [_pending_check()])
        record(self._context, asset, key, recorded)
        self.publish(asset, key, tables, held)
        self.collect(block=False)  # the other partitions' publishes that are done meanwhile
        return recorded

    def publish(
        self, asset: dg.AssetKey, key: str, tables: Sequence[str], held: HeldPartition
    ) -> None:
        """Publish the partition's `tables` in the background (a partition the night keeps as
        landed, or one just recorded); `collect` records its check."""
        if not self._trino.enabled:
            return
        ds, source = partition_parts_of(key)
        args = (self._trino, self._store, list(tables), ds, source, held.check)
        self._publishing.append(_Publishing(asset, key, self._pool.submit(publish_tables, *args)))

    def collect(self, *, block: bool, keys: set[str] | None = None) -> None:
        """Record the checks of the finished publishes (all of `keys`', waiting, with `block`)."""
        wanted = [p for p in self._publishing if keys is None or p.key in keys]
        if block:
            wait([p.future for p in wanted])
        for item in [p for p in wanted if p.future.done()]:
            self._publishing.remove(item)
            try:
                check = item.future.result()
            except LeaseLostError as error:  # another run holds it now: it publishes it
                self.lost[item.key] = str(error)
                continue
            if not check.passed:
                reason = getattr(check.metadata.get("reason"), "value", "")
                self._context.log.warning(
                    f"Trino publish of {item.key} failed, the catch-up retries it: {reason}"
                )
            record(
                self._context,
                item.asset,
                item.key,
                dg.MaterializeResult(check_results=[check]),
                materialized=False,
            )
