"""The quarantine table is shared by the stages of a partition: each stage replaces only its rows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from typing import TYPE_CHECKING

import polars as pl

from kimi_batch.crash_points import crash_point
from kimi_batch.pipeline import PARTITION_COLUMNS, QuarantineRow
from kimi_batch.state import Fence

if TYPE_CHECKING:
    from kimi_batch.warehouse import Warehouse


def replace_quarantine(
    warehouse: Warehouse,
    ds: str | date,
    source: str,
    stage: str,
    rows: Iterable[QuarantineRow],
    *,
    guard: Fence | None = None,
) -> int:
    """Replace `stage`'s quarantine rows of the partition, keeping the other stages' rows.

    A read-modify-write of one partition: callers hold the partition's lease around it and pass
    the lease as `guard` (confirmed where the replace commits). Returns the number of rows
    written for `stage`.
    """
    frame = warehouse.read_partition("quarantine", ds, source)
    kept = frame.filter(pl.col("stage") != stage).drop(list(PARTITION_COLUMNS))
    mine = list(rows)
    warehouse.write_partition(
        "quarantine",
        ds,
        source,
        [*(QuarantineRow.model_validate(row) for row in kept.iter_rows(named=True)), *mine],
        guard=guard,
    )
    crash_point("quarantine.rows_replaced")
    return len(mine)
