"""What the batch assets share: running the engine, landing rows, publishing them, checks."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

import dagster as dg
import polars as pl
from pydantic import BaseModel

from kimi_batch.defs.resources.digest import DigestResource
from kimi_batch.defs.resources.llama import LlamaServerResource
from kimi_batch.defs.resources.trino import TrinoResource
from kimi_batch.defs.resources.warehouse import WarehouseResource
from kimi_batch.engine.digest import SystemDigest
from kimi_batch.engine.ledger import Ledger
from kimi_batch.engine.progress import notify
from kimi_batch.engine.requests import GenerationRequest, GenerationResult
from kimi_batch.engine.runner import BatchEngine, BatchOutcome
from kimi_batch.engine.stats import ProgressEvent
from kimi_batch.storage import StorageError, Warehouse, polars_schema
from kimi_batch.storage.quarantine import replace_quarantine
from kimi_batch.tasks.quarantine import failure_rows
from kimi_batch.tasks.rows import PARTITION_COLUMNS, GenerationColumns, QuarantineRow

__all__ = [
    "BATCH_GROUP",
    "LLAMA_POOL",
    "check_specs",
    "iter_batch_results",
    "land_outputs",
    "lease_key",
    "publish",
    "read_rows",
    "run_batch",
]

RowT = TypeVar("RowT", bound=BaseModel)

BATCH_GROUP = "batch"
LLAMA_POOL = "llama_server"
TRUNCATION_WARN_RATE = 0.25


def lease_key(ds: str, source: str) -> str:
    """The partition's lease in the ledger: one writer per partition, whatever the pool limit."""
    return f"{ds}|{source}"


def run_batch(
    context: dg.AssetExecutionContext,
    llama: LlamaServerResource,
    digest: DigestResource,
    warehouse: WarehouseResource,
    requests: Sequence[GenerationRequest],
) -> BatchOutcome:
    """Run requests on every endpoint's slots; finished rows are in the ledger as they land."""
    loaded = digest.load()
    with warehouse.ledger() as ledger:
        outcome = asyncio.run(_generate(context, llama, loaded, ledger, requests))
    stats = outcome.stats
    context.log.info(
        f"{stats.generated} generated, {stats.from_ledger} from the ledger, {stats.failed} failed, "
        f"max {stats.max_in_flight} in flight"
    )
    return outcome


def _progress_reporter(context: dg.AssetExecutionContext) -> Callable[[ProgressEvent], None]:
    """The run log gets the periodic line; in-process listeners (a terminal bar) the event."""
    label = f"{context.asset_key.to_user_string()} {context.partition_key}"

    def report(event: ProgressEvent) -> None:
        context.log.info(str(event))
        notify(event.model_copy(update={"label": label}))

    return report


async def _generate(
    context: dg.AssetExecutionContext,
    llama: LlamaServerResource,
    loaded: SystemDigest,
    ledger: Ledger,
    requests: Sequence[GenerationRequest],
) -> BatchOutcome:
    """One event loop and one server session per materialization: prepare, then generate."""
    prepared = await llama.prepare(loaded)
    engine = BatchEngine(
        prepared.endpoints,
        loaded,
        ledger,
        digest_tokens=prepared.digest_tokens,
        on_progress=_progress_reporter(context),
        on_unreachable=llama.respawn_if_down,
        on_hung=llama.restart_hung,
    )
    return await engine.run(requests)


def iter_batch_results(
    warehouse: WarehouseResource, outcome: BatchOutcome, *, chunk_size: int = 256
) -> Iterator[GenerationResult]:
    """The batch's finished rows in request order, streamed from the ledger in chunks."""
    with warehouse.ledger() as ledger:
        yield from outcome.iter_results(ledger, chunk_size=chunk_size)


def read_rows(
    warehouse: Warehouse, table: str, ds: str, source: str, model: type[RowT]
) -> list[RowT]:
    frame = warehouse.read_partition(table, ds, source)
    frame = frame.drop([c for c in PARTITION_COLUMNS if c in frame.columns])
    return [model.model_validate(row) for row in frame.iter_rows(named=True)]


def publish(
    context: dg.AssetExecutionContext,
    trino: TrinoResource,
    warehouse: Warehouse,
    tables: Sequence[str],
    ds: str,
    source: str,
) -> dg.AssetCheckResult:
    """Register the partitions in Trino; a failure is reported, never raised (Parquet landed)."""
    if not trino.enabled:
        return dg.AssetCheckResult(
            check_name="published_to_trino", passed=True, metadata={"trino": "not configured"}
        )
    try:
        publisher = trino.publisher()
        for table in tables:
            publisher.publish_partition(warehouse, table, ds, source)
    except StorageError as error:
        context.log.warning(f"Trino publish failed, run `kimi-batch publish` later: {error}")
        return dg.AssetCheckResult(
            check_name="published_to_trino",
            passed=False,
            metadata={"reason": str(error)[:1000], "catch_up": "kimi-batch publish"},
        )
    return dg.AssetCheckResult(
        check_name="published_to_trino", passed=True, metadata={"tables": ", ".join(tables)}
    )


def generation_checks(
    table: str, rows: Sequence[GenerationColumns], texts: Sequence[str], path: Path
) -> list[dg.AssetCheckResult]:
    """Empty outputs, truncation rate, duplicate request ids, and the file's schema."""
    total = len(rows)
    duplicates = [rid for rid, n in Counter(r.request_id for r in rows).items() if n > 1]
    truncated = sum(1 for r in rows if r.finish_reason == "length")
    empty = sum(1 for text in texts if not text.strip())
    written = pl.read_parquet_schema(path)
    expected = polars_schema(table)
    schema_ok = dict(written) == dict(expected)
    rate = truncated / total if total else 0.0
    warn = dg.AssetCheckSeverity.WARN
    return [
        dg.AssetCheckResult(
            check_name="no_duplicate_request_ids",
            passed=not duplicates,
            metadata={"duplicates": len(duplicates)},
        ),
        dg.AssetCheckResult(
            check_name="truncation_rate",
            passed=rate <= TRUNCATION_WARN_RATE,
            severity=warn,
            metadata={"truncated": truncated, "rate": rate, "threshold": TRUNCATION_WARN_RATE},
        ),
        dg.AssetCheckResult(
            check_name="no_empty_outputs",
            passed=empty == 0,
            severity=warn,
            metadata={"empty": empty},
        ),
        dg.AssetCheckResult(
            check_name="matches_table_schema",
            passed=schema_ok,
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


def check_specs(asset: str) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(name, asset=asset) for name in CHECK_NAMES]


def generation_metadata(
    outcome: BatchOutcome,
    *,
    rows: int,
    quarantined: int,
    table: str,
    path: Path,
    trino: TrinoResource,
) -> dict[str, dg.RawMetadataValue]:
    stats = outcome.stats
    metadata: dict[str, dg.RawMetadataValue] = {
        "rows": rows,
        "requests": stats.total,
        "generated": stats.generated,
        "from_ledger": stats.from_ledger,
        "failures": stats.failed,
        "quarantined": quarantined,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": stats.cached_tokens,
        "prompt_tokens_per_s": stats.prompt_tokens_per_s,
        "completion_tokens_per_s": stats.completion_tokens_per_s,
        "cache_hit_ratio": stats.cache_hit_ratio,
        "digest_reprefills": stats.digest_reprefills,
        "latency_p50_ms": stats.latency_p50_ms,
        "latency_p95_ms": stats.latency_p95_ms,
        "max_in_flight": stats.max_in_flight,
        "wall_s": stats.wall_s,
        "path": dg.MetadataValue.path(str(path)),
    }
    if trino.enabled:
        name = trino.table_name(table)
        metadata["trino_table"] = name
        metadata["query"] = dg.MetadataValue.md(f"```sql\nSELECT * FROM {name} LIMIT 100\n```")
    return metadata


def land_outputs(
    context: dg.AssetExecutionContext,
    *,
    table: str,
    stage: Literal["amplify", "distill"],
    rows: Sequence[GenerationColumns],
    texts: Sequence[str],
    set_aside: Sequence[QuarantineRow],
    outcome: BatchOutcome,
    warehouse: Warehouse,
    trino: TrinoResource,
    ds: str,
    source: str,
    extra_metadata: dict[str, dg.RawMetadataValue] | None = None,
) -> dg.MaterializeResult:
    """Write the partition and this stage's quarantine rows, publish them, check and report."""
    failed = failure_rows(
        outcome.failures,
        stage=stage,
        source_file=source,
        model=outcome.model,
        digest_sha=outcome.digest_sha256,
        created_at=datetime.now(UTC),
    )
    written = warehouse.write_partition(table, ds, source, rows)
    quarantined = replace_quarantine(warehouse, ds, source, stage, [*set_aside, *failed])
    checks = generation_checks(table, rows, texts, written.path)
    checks.append(publish(context, trino, warehouse, [table, "quarantine"], ds, source))
    metadata = generation_metadata(
        outcome,
        rows=written.rows,
        quarantined=quarantined,
        table=table,
        path=written.path,
        trino=trino,
    )
    return dg.MaterializeResult(
        metadata={**metadata, **(extra_metadata or {})}, check_results=checks
    )
