"""A Hive-layout warehouse (before issue 43) copied into the Iceberg tables, no row regenerated.

The old layout kept one current file a partition: `<root>/<table>/ds=D/source=S/part-0.parquet`
in a folder warehouse; on an object store, a version a partition
(`<root>/<table>/ds=D/source=S/<version>/part-0.parquet`) and the ledger's `warehouse_partitions`
table naming the current one (replaced versions still in the bucket are not read). Each current
file becomes its partition in the Iceberg table by one overwrite commit, its rows as they are
(`Warehouse.write_frame`); the row counts are checked partition by partition against the file.

A partition the Iceberg table already holds is left as it is unless `replace`: a night run since
the upgrade wrote it from newer inputs, and a rerun of the migration copies nothing twice. The old
files are left in place (the tables live under `<root>/<namespace>/`, apart from them): delete
`<root>/<table>/` once the tables read right.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import BaseModel, ConfigDict

from kimi_batch.paths import StateLocation
from kimi_batch.state import read_state
from kimi_batch.storage import InvalidPartitionError, StorageError
from kimi_batch.warehouse.schema import PARTITION_COLUMNS, TABLES, validate_ds, validate_source
from kimi_batch.warehouse.tables import Warehouse

PART_FILE = "part-0.parquet"


class MigrationError(StorageError):
    """The copy's row counts differ from the files', or the old warehouse cannot be read."""


class HivePartition(BaseModel):
    """One partition's current file in the old layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    ds: str
    source: str
    file: str  # a local path or an s3:// URL


class MigratedPartition(BaseModel):
    """What the migration did with one partition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    ds: str
    source: str
    file: str
    action: Literal["copied", "present", "empty"]  # present: left as the table holds it
    rows_file: int
    rows_table: int


def _folder_partitions(root: Path, table: str) -> list[HivePartition]:
    found = []
    for file in sorted((root / table).glob(f"ds=*/source=*/{PART_FILE}")):
        try:
            ds = validate_ds(file.parent.parent.name.removeprefix("ds="))
            source = validate_source(file.parent.name.removeprefix("source="))
        except InvalidPartitionError:
            continue  # not a partition the old writer made
        found.append(HivePartition(table=table, ds=ds, source=source, file=str(file)))
    return found


def _pointed_partitions(root: str, pointers: StateLocation, table: str) -> list[HivePartition]:
    """The versions `warehouse_partitions` names current (none when it does not exist)."""
    db = read_state(pointers)
    if db is None:
        return []
    with db:
        if not db.columns("warehouse_partitions"):
            return []
        rows = db.execute(
            "SELECT ds, source, version FROM warehouse_partitions WHERE table_name = ? "
            "ORDER BY ds, source",
            (table,),
        ).fetchall()
    return [
        HivePartition(
            table=table,
            ds=str(ds),
            source=str(source),
            file=f"{root}/{table}/ds={ds}/source={source}/{version}/{PART_FILE}",
        )
        for ds, source, version in rows
    ]


def hive_partitions(
    root: str | Path, pointers: StateLocation | None, tables: Iterable[str] = TABLES
) -> list[HivePartition]:
    """The old warehouse's current partition files: a folder's `part-0.parquet` files, or the
    versions an object store's pointer table (in the ledger's store, `pointers`) names."""
    if isinstance(root, str) and root.startswith("s3://"):
        if pointers is None:
            raise MigrationError(f"{root}: an object store's current versions need the ledger")
        return [p for t in tables for p in _pointed_partitions(root.rstrip("/"), pointers, t)]
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise MigrationError(f"{folder}: no such warehouse folder")
    return [p for t in tables for p in _folder_partitions(folder, t)]


def _table_counts(warehouse: Warehouse, table: str) -> dict[tuple[str, str], int]:
    iceberg = warehouse.iceberg_table(table)
    if iceberg is None or iceberg.current_snapshot() is None:
        return {}
    return {
        (item["partition"][PARTITION_COLUMNS[0]], item["partition"][PARTITION_COLUMNS[1]]): int(
            item["record_count"]
        )
        for item in iceberg.inspect.partitions().to_pylist()
    }


def _read(partition: HivePartition, options: dict[str, str] | None) -> pl.DataFrame:
    try:
        return pl.read_parquet(partition.file, storage_options=options)
    except (OSError, pl.exceptions.PolarsError) as error:
        raise MigrationError(f"{partition.file}: unreadable ({error})") from error


def _rows(partition: HivePartition, options: dict[str, str] | None) -> int:
    """The file's row count, from its footer (a partition the tables already hold)."""
    try:
        rows = pl.scan_parquet(partition.file, storage_options=options)
        return int(rows.select(pl.len()).collect().item())
    except (OSError, pl.exceptions.PolarsError) as error:
        raise MigrationError(f"{partition.file}: unreadable ({error})") from error


def migrate(
    warehouse: Warehouse,
    partitions: Iterable[HivePartition],
    *,
    replace: bool = False,
    storage_options: dict[str, str] | None = None,
) -> list[MigratedPartition]:
    """Copy each partition's file into its table (one overwrite commit each), then check
    every copied partition's row count against its file's (MigrationError when one differs)."""
    by_table: dict[str, list[HivePartition]] = {}
    for partition in partitions:
        by_table.setdefault(partition.table, []).append(partition)
    done: list[MigratedPartition] = []
    for table, items in by_table.items():
        present = _table_counts(warehouse, table)
        actions: list[tuple[HivePartition, str, int]] = []
        for item in items:
            key = (item.ds, item.source)
            if key in present and not replace:
                actions.append((item, "present", _rows(item, storage_options)))
                continue
            frame = _read(item, storage_options)
            if frame.height or key in present:
                warehouse.write_frame(table, item.ds, item.source, frame)
            actions.append((item, "copied" if frame.height else "empty", frame.height))
        after = _table_counts(warehouse, table)
        done += [
            MigratedPartition(
                **item.model_dump(),
                action=action,  # type: ignore[arg-type]
                rows_file=rows,
                rows_table=after.get((item.ds, item.source), 0),
            )
            for item, action, rows in actions
        ]
    wrong = [m for m in done if m.action != "present" and m.rows_file != m.rows_table]
    if wrong:
        named = ", ".join(
            f"{m.table} ds={m.ds} source={m.source}: {m.rows_file} in the file, "
            f"{m.rows_table} in the table"
            for m in wrong[:5]
        )
        raise MigrationError(f"row counts differ after the copy: {named}")
    return done
