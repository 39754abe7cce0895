"""A stage's partition landed, no Dagster: its rows and quarantine written under its lease, the
input version it consumed, its data version, and the figures its record carries.

`write_stage` writes a planned partition's rows (through the quality gate when the stage is
gated and the gate on: contamination and duplicates set aside, the kept rows indexed under the
lease once the block ends) and its quarantine. A commit is the publication: Trino, polars and
pyiceberg read the tables' catalog and see it on their next query, so nothing is registered
after it. The Dagster adapter (`defs/assets/landing.py`) judges the checks and records it.

A stage's partition has a data version (`stage_data_version`) made from what determines its
rows: its input version and its requests' identities (the ledger answers each request once), so
a partition built twice from the same input by the same stage carries the same version, whichever
run built it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import polars as pl

from kimi_batch.crash_points import crash_point
from kimi_batch.engine import BatchOutcome, GenerationResult
from kimi_batch.pipeline.driver import StagePlan, plan_partition
from kimi_batch.pipeline.generation_task import GenerationTask, RowReader
from kimi_batch.pipeline.lease import HeldPartition
from kimi_batch.pipeline.quarantine import INPUT_STAGE
from kimi_batch.pipeline.sink import StageSink
from kimi_batch.quality import PartitionGate, QualityGate
from kimi_batch.storage import replace_quarantine
from kimi_batch.warehouse import PartitionWrite, Warehouse

Task = GenerationTask[Any, Any]


@dataclass(frozen=True)
class StageWrite:
    """A partition's rows and quarantine, written: what its checks and record are made of."""

    written: PartitionWrite
    quarantined: int
    sink: StageSink[Any, Any]
    screen: PartitionGate | None


@contextmanager
def screening(
    gate: QualityGate | None,
    store: Warehouse,
    task: Task,
    inputs: Any,
    partition: tuple[str, str],
    held: HeldPartition,
) -> Iterator[PartitionGate | None]:
    """The partition's screening when its stage is gated and the gate on (else None); its kept
    rows are indexed, under its lease, when the block ends without an error."""
    if gate is None or not gate.screens(task):
        yield None
        if gate is not None and task.quality_gated:
            gate.release(*partition)  # landed unscreened: its old index entries must not answer
        return
    ds, source = partition
    with gate.partition(store, task, inputs, ds, source, guard=held.check) as screen:
        yield screen


def write_stage(
    plan: StagePlan,
    held: HeldPartition,
    outcome: BatchOutcome,
    results: Iterable[GenerationResult],
    *,
    store: Warehouse,
    gate: QualityGate | None = None,
) -> StageWrite:
    """Write the partition's rows (screened by `gate`) and its quarantine (lease held)."""
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
    return StageWrite(written=written, quarantined=quarantined, sink=sink, screen=screen)


def stage_data_version(plan: StagePlan, outcome: BatchOutcome) -> str:
    """The partition's data version: its table, input version, and the ids of the requests its
    rows come from and of those that failed (each id names a ledger key: digest, model, params,
    messages, sample), so the same input through the same stage gives the same version."""
    digest = hashlib.sha256(f"{plan.task.table}\n{plan.input_sha}\n".encode())
    for request_id in sorted(row.request_id for row in outcome.planned):
        digest.update(f"{request_id}\n".encode())
    for request_id in sorted(failure.request_id for failure in outcome.failures):
        digest.update(f"failed {request_id}\n".encode())
    return digest.hexdigest()


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


def plan_stage(task: Task, store: Warehouse, ds: str, source: str) -> StagePlan:
    """Read the partition's inputs of `task` from the warehouse and build its requests."""
    read: RowReader = lambda table, model: store.read_rows(table, ds, source, model)  # noqa: E731
    return plan_partition(task, read, ds, source, consumed_input_sha(store, ds, source))


def generation_figures(outcome: BatchOutcome) -> dict[str, float | int | str]:
    """The engine's figures of one batch: tok/s to 0.1, ms to 1, ratios to 0.001."""
    stats = outcome.stats
    return {
        "requests": stats.total,
        "generated": stats.generated,
        "from_ledger": stats.from_ledger,
        "failures": stats.failed,
        "not_started": stats.not_started,
        "truncated": stats.truncated,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": stats.cached_tokens,
        "prompt_tokens_per_s": round(stats.prompt_tokens_per_s, 1),
        "completion_tokens_per_s": round(stats.completion_tokens_per_s, 1),
        "cache_hit_ratio": round(stats.cache_hit_ratio, 3),
        "digest_reprefills": stats.digest_reprefills,
        "server_hangs": stats.hangs,
        "latency_p50_ms": round(stats.latency_p50_ms, 0),
        "latency_p95_ms": round(stats.latency_p95_ms, 0),
        "max_in_flight": stats.max_in_flight,
        "in_flight_at_start": stats.in_flight_at_start,
        "wall_s": round(stats.wall_s, 1),
        "digest_sha256": outcome.digest_sha256[:12],
        "digest_sha256_full": outcome.digest_sha256,
    }


_SUMMARY_KEYS = (
    ("rows", "rows"),
    ("quarantined", "quarantined"),
    ("generated", "generated"),
    ("from_ledger", "from the ledger"),
    ("completion_tokens_per_s", "tok/s"),
    ("cache_hit_ratio", "cache hit"),
    ("latency_p95_ms", "p95 latency (ms)"),
    ("wall_s", "wall (s)"),
)


def summary_markdown(figures: Mapping[str, object]) -> str:
    """The headline figures of a materialization as a Markdown table."""
    lines = ["| figure | value |", "| --- | --- |"]
    lines += [f"| {label} | {figures[key]} |" for key, label in _SUMMARY_KEYS if key in figures]
    return "\n".join(lines)
