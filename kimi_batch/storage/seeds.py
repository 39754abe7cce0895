"""The `seeds` table: a landed input file read, validated and written in chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

from kimi_batch.state import Fence
from kimi_batch.storage.parquet import PartitionWrite, Warehouse
from kimi_batch.tasks.inputs import InputBatch, SeedPrompt
from kimi_batch.tasks.quarantine import input_row
from kimi_batch.tasks.rows import QuarantineRow, SeedRow
from kimi_batch.tasks.seeds import seed_rows

__all__ = ["ChunkReader", "LengthCheck", "land_seeds"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class ChunkReader(Protocol):
    """Reads an input file as chunks of seeds and quarantine rows (`tasks.reader.InputReader`)."""

    def chunks(self, path: Path, /) -> Iterable[InputBatch]: ...


LengthCheck = Callable[[Sequence[SeedPrompt]], InputBatch]
"""Splits seeds into those that fit a slot and quarantine rows for the over-long ones."""


def land_seeds(
    warehouse: Warehouse,
    ds: str,
    source: str,
    *,
    snapshot: Path | None,
    reader: ChunkReader,
    input_sha256: str,
    check_lengths: LengthCheck,
    now: datetime,
    set_aside: list[QuarantineRow],
    guard: Fence | None = None,
) -> PartitionWrite:
    """Stream `snapshot` into the partition's `seeds` file; bad rows are appended to `set_aside`.

    Memory stays bounded by one chunk of rows whatever the file's size. Without a snapshot (the
    input was refused before it could land) the partition is written empty.
    """

    def rows() -> Iterator[SeedRow]:
        if snapshot is None:
            return
        for chunk in reader.chunks(snapshot):
            set_aside.extend(chunk.quarantined)
            checked = check_lengths(chunk.seeds)
            set_aside.extend(checked.quarantined)
            for row in seed_rows(checked.seeds, input_sha256=input_sha256, created_at=now):
                if (reason := _unstorable(row)) is None:
                    yield row
                else:
                    set_aside.append(_set_aside(row, reason, now))

    return warehouse.write_partition("seeds", ds, source, rows(), guard=guard)


def _unstorable(row: SeedRow) -> str | None:
    """Why the row cannot be a row of the table (an integer past its 64-bit columns); validation
    refuses such values, and this keeps one that gets past it from failing the whole write."""
    for name, value in row:
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            return f"{name}: must be a 64-bit integer (the table stores it as BIGINT)"
    return None


def _set_aside(row: SeedRow, reason: str, now: datetime) -> QuarantineRow:
    return input_row(
        source_file=row.source_file,
        line=row.line,
        reason=reason,
        raw=row.prompt,
        now=now,
        input_id=row.input_id,
    )
