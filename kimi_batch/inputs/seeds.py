"""The `seeds` table: a landed input file read, validated and written in chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kimi_batch.crash_points import crash_point
from kimi_batch.inputs.landing import Landing
from kimi_batch.inputs.prompts import InputBatch, SeedPrompt, seed_rows
from kimi_batch.inputs.tools import unicode_error
from kimi_batch.pipeline import INPUT_STAGE, QuarantineRow, SeedRow, input_row
from kimi_batch.state import Fence

if TYPE_CHECKING:
    from kimi_batch.warehouse import PartitionWrite, Warehouse

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

    written = warehouse.write_partition("seeds", ds, source, rows(), guard=guard)
    crash_point("seeds.rows_written")
    return written


def land_input(
    warehouse: Warehouse,
    landing: Landing,
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
    """The partition's input version landed whole: its `seeds` (`land_seeds`), then its input
    quarantine (`set_aside` and the rows the reader set aside, stamped with the version), then
    the version recorded as consumed in the manifest. Seeds at a version do not say its
    quarantine was written: the record is forgotten before the seeds' write, so a run killed
    between the two leaves none, and the night lands the version again (`Landing.consumed`),
    even when the seeds went back to the content recorded last."""
    landing.forget_consumed(ds, source)
    written = land_seeds(
        warehouse,
        ds,
        source,
        snapshot=snapshot,
        reader=reader,
        input_sha256=input_sha256,
        check_lengths=check_lengths,
        now=now,
        set_aside=set_aside,
        guard=guard,
    )
    sha = input_sha256 or None
    stamped = [row.model_copy(update={"input_sha256": sha}) for row in set_aside]
    warehouse.replace_quarantine(ds, source, INPUT_STAGE, stamped, guard=guard)
    if sha is not None:
        landing.record_consumed(ds, source, sha)
    return written


def _unstorable(row: SeedRow) -> str | None:
    """Why the row cannot be a row of the table (an integer past its 64-bit columns, a string
    that is not valid Unicode: the table stores UTF-8); validation refuses such values, and this
    keeps one that gets past it from failing the whole write."""
    for name, value in row:
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            return f"{name}: must be a 64-bit integer (the table stores it as BIGINT)"
        if isinstance(value, str) and (error := unicode_error(value)) is not None:
            return f"{name}: {error}"
    for index, message in enumerate(row.messages):
        if (error := unicode_error(message.content)) is not None:
            return f"messages[{index}].content: {error}"
    return None


def _set_aside(row: SeedRow, reason: str, now: datetime) -> QuarantineRow:
    # The quarantine is stored as UTF-8 too: what is not valid Unicode is shown escaped.
    return input_row(
        source_file=_storable(row.source_file),
        line=row.line,
        reason=reason,
        raw=_storable(row.prompt),
        now=now,
        input_id=_storable(row.input_id),
    )


def _storable(text: str) -> str:
    """`text`, its lone surrogates written as `\\udNNN` escapes."""
    if unicode_error(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
