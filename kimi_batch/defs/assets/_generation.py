"""What the batch assets share: the partition's lease, an engine run under the nightly window,
reading a partition's rows, publishing, the generation checks."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import dagster as dg
import polars as pl
from pydantic import BaseModel

from kimi_batch.defs.check_states import CONTAMINATION_CHECK, DUPLICATE_CHECK
from kimi_batch.defs.jobs import STOPPED_TAG, WINDOW_TAG
from kimi_batch.defs.metadata import generation_figures
from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.defs.stages import BATCH_GROUP
from kimi_batch.engine import (
    BatchEngine,
    BatchOutcome,
    BatchRun,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    Ledger,
    ProgressEvent,
    notify,
)
from kimi_batch.storage import StorageError, Warehouse, polars_schema
from kimi_batch.tasks.generation_task import GenerationTask
from kimi_batch.tasks.sink import CheckFigures

__all__ = [
    "BATCH_GROUP",
    "CHECK_NAMES",
    "LLAMA_POOL",
    "HeldPartition",
    "RunContext",
    "check_specs",
    "engine_session",
    "generation_checks",
    "partition_lease",
    "publish",
    "publish_tables",
    "read_rows",
    "stage_check_names",
    "stopped_at_window",
    "window_end",
]

RowT = TypeVar("RowT", bound=BaseModel)
# An asset's step (one partition) or the nightly op's (many): what the helpers below read of it.
RunContext = dg.AssetExecutionContext | dg.OpExecutionContext

LLAMA_POOL = "llama_server"
# Above this share of answers cut off at max_tokens the truncation check fails (ERROR): those
# answers are set aside, so most of the night's work would be in quarantine.
TRUNCATION_FAIL_RATE = 0.25
# A lease lives this long without its holder's heartbeat: a killed run frees its partition then.
LEASE_TTL_S = 60.0
# A second run on the same partition waits this long, longer than a dead holder's lease can last,
# then leaves a live holder the partition (it writes every row; a second run would only repeat).
LEASE_WAIT_S = LEASE_TTL_S + 30.0


@dataclass(frozen=True)
class HeldPartition:
    """The ledger, and the lease this run holds on the partition: the fence of every Parquet
    write (`guard=held.lease`), `check` before the other writes."""

    ledger: Ledger
    lease: Lease

    def check(self) -> None:
        """Raises LeaseLostError when another run has taken the partition over."""
        self.lease.check()


@contextmanager
def partition_lease(
    context: RunContext, warehouse: WarehouseResource, ds: str, source: str
) -> Iterator[HeldPartition]:
    """Hold the partition (generation and every write of its tables) for this run; a lease lost
    on the way (this run stalled past its ttl) fails the step instead of writing."""
    with warehouse.ledger() as ledger:
        lease = ledger.lease(
            f"{ds}|{source}", context.run.run_id, ttl_s=LEASE_TTL_S, wait_s=LEASE_WAIT_S
        )
        try:
            held = lease.__enter__()
        except LeaseHeldError as error:
            raise dg.Failure(
                f"partition {ds}|{source} is being written by another run ({error}); "
                "this run leaves it alone"
            ) from error
        try:
            yield HeldPartition(ledger=ledger, lease=held)
        except LeaseLostError as error:
            raise dg.Failure(str(error)) from error
        finally:
            lease.__exit__(None, None, None)


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
) -> AsyncIterator[BatchRun]:
    """One engine run under the run's window, open while the block adds requests to it (a
    batch's outcome says whether the window cut it short); progress is logged as `label`."""
    loaded = digest.load()
    prepared = await llama.prepare(loaded)
    engine = BatchEngine(
        prepared.endpoints,
        loaded,
        ledger,
        digest_tokens=prepared.digest_tokens,
        on_progress=_progress_reporter(context, label),
        on_unreachable=llama.respawn_if_down,
        on_hung=llama.restart_hung,
        speed_store=llama.speed_store(),
    )
    async with engine.session(stop_at=window_end(context)) as run:
        yield run


def read_rows(
    warehouse: Warehouse, table: str, ds: str, source: str, model: type[RowT]
) -> list[RowT]:
    return warehouse.read_rows(table, ds, source, model)


def publish(
    context: RunContext,
    trino: TrinoResource,
    warehouse: Warehouse,
    tables: Sequence[str],
    ds: str,
    source: str,
    guard: Callable[[], None] | None = None,
) -> dg.AssetCheckResult:
    """Register the partitions in Trino; a failure is reported, never raised (Parquet landed).

    `guard` (the lease check) runs first: a run that lost the partition publishes nothing.
    """
    check = publish_tables(trino, warehouse, tables, ds, source, guard)
    if not check.passed:
        context.log.warning(
            f"Trino publish failed, run `kimi-batch publish` later ({ds}|{source}): "
            f"{getattr(check.metadata.get('reason'), 'value', '')}"
        )
    return check


def publish_tables(
    trino: TrinoResource,
    warehouse: Warehouse,
    tables: Sequence[str],
    ds: str,
    source: str,
    guard: Callable[[], None] | None = None,
) -> dg.AssetCheckResult:
    """`publish` without the run log: safe to call off the run's thread (the night's
    background publishing), the caller logs the outcome."""
    if guard is not None:
        guard()
    if not trino.enabled:
        return dg.AssetCheckResult(
            check_name="published_to_trino", passed=True, metadata={"trino": "not configured"}
        )
    try:
        with trino.publisher() as publisher:
            for table in tables:
                publisher.publish_partition(warehouse, table, ds, source)
    except StorageError as error:
        return dg.AssetCheckResult(
            check_name="published_to_trino",
            passed=False,
            metadata={"reason": str(error)[:1000], "catch_up": "kimi-batch publish"},
        )
    return dg.AssetCheckResult(
        check_name="published_to_trino", passed=True, metadata={"tables": ", ".join(tables)}
    )


def generation_checks(
    table: str, figures: CheckFigures, written: Mapping[str, pl.DataType]
) -> list[dg.AssetCheckResult]:
    """Duplicate request ids, truncation rate (fails above TRUNCATION_FAIL_RATE), empty outputs
    (set aside included), and schema."""
    expected = polars_schema(table)
    warn = dg.AssetCheckSeverity.WARN
    return [
        dg.AssetCheckResult(
            check_name="no_duplicate_request_ids",
            passed=figures.duplicate_request_ids == 0,
            metadata={"duplicates": figures.duplicate_request_ids},
        ),
        dg.AssetCheckResult(
            check_name="truncation_rate",
            passed=figures.truncation_rate <= TRUNCATION_FAIL_RATE,
            metadata={
                "truncated": figures.truncated,
                "rate": round(figures.truncation_rate, 3),
                "threshold": TRUNCATION_FAIL_RATE,
            },
        ),
        dg.AssetCheckResult(
            check_name="no_empty_outputs",
            passed=figures.empty == 0,
            severity=warn,
            metadata={"empty": figures.empty},
        ),
        dg.AssetCheckResult(
            check_name="matches_table_schema",
            passed=dict(written) == dict(expected),
            metadata={"columns": len(written), "expected_columns": len(expected)},
        ),
    ]


CHECK_NAMES = (
    "no_duplicate_request_ids",
    "truncation_rate",
    "no_empty_outputs",
    "matches_table_schema",
    "published_to_trino",
)


def stage_check_names(task: type[GenerationTask[Any, Any]]) -> tuple[str, ...]:
    """The checks a stage's asset declares: every stage's, and the gate's when it is gated."""
    gated = (CONTAMINATION_CHECK, DUPLICATE_CHECK) if task.quality_gated else ()
    return (*CHECK_NAMES, *gated)


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
